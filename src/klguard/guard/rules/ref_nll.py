"""ref_nll: `hacking/ref_nll` (the samples' mean NLL under the reference, the log of their perplexity under the frozen
base model) above its baseline + `ref_nll_rise`."""

from __future__ import annotations

from klguard.fields import at_least
from klguard.guard.registry import Key, register
from klguard.guard.shapes import rise_signal
from klguard.guard.signals import REF_NLL

register(rise_signal(
    "ref_nll", 180, REF_NLL, baseline="ref_nll", unit=" nats", what="NLL under the reference",
    sees="samples drifting from the reference model's text", reference_baselines=("ref_nll",),
    rise=Key("ref_nll_rise", 0.5, "hacking/ref_nll (nats/token under the reference) above baseline + this: hacking "
             "signal", at_least(0))))
