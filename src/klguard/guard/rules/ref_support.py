"""ref_support: `hacking/ref_low_prob_share` (the share of sampled tokens whose reference probability is under
`support_prob_floor`) above its baseline + `ref_support_rise`: the policy samples where the reference does not (the
support BSPO, Dai et al. 2025, keeps the policy in)."""

from __future__ import annotations

from klguard.fields import at_least, interval
from klguard.guard.registry import Key, register
from klguard.guard.shapes import rise_signal
from klguard.guard.signals import REF_LOW_PROB

register(rise_signal(
    "ref_support", 170, REF_LOW_PROB, baseline="ref_low", sees="samples leaving the reference's support",
    what="share of tokens the reference finds unlikely", reference_baselines=("ref_low",),
    keys=(Key("support_prob_floor", 0.01, "Reference probability under which a sampled token is off-support",
              interval("(0, 1)")),),
    rise=Key("ref_support_rise", 0.05, "hacking/ref_low_prob_share (off-support tokens) above baseline + this: "
             "hacking signal", at_least(0))))
