"""repetition: `hacking/repeated_ngram_share` above its baseline + `repetition_rise` (looping text)."""

from __future__ import annotations

from klguard.fields import at_least
from klguard.guard.registry import Key, register
from klguard.guard.shapes import rise_signal
from klguard.guard.signals import REPETITION

register(rise_signal(
    "repetition", 150, REPETITION, baseline="repetition", sees="looping, repeated text", what="repeated n-gram share",
    rise=Key("repetition_rise", 0.15, "hacking/repeated_ngram_share above baseline + this: hacking signal",
             at_least(0))))
