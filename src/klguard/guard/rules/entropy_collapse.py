"""entropy_collapse: `actor/entropy` below `entropy_collapse_ratio` x its baseline."""

from __future__ import annotations

from klguard.fields import interval
from klguard.guard.registry import GuardRule, Key, register
from klguard.guard.signals import ENTROPY
from klguard.guard.step import Evidence, Step

NAME = "entropy_collapse"


def measure(step: Step) -> Evidence | None:
    return step.times(NAME, ENTROPY, "entropy", step.cfg.entropy_collapse_ratio, False, "entropy")


register(GuardRule(
    name=NAME, kind="signal", order=130, reads=((ENTROPY,),), default_on=True,
    says=lambda c: f"actor/entropy < {c.entropy_collapse_ratio:g}x its first {c.baseline_window} steps: hacking",
    sees="an entropy collapse",
    do="raise the sampling temperature or add an entropy bonus; check whether the reward pays one answer",
    keys=(Key("entropy_collapse_ratio", 0.3, "actor/entropy below this x baseline: hacking signal",
              interval("(0, 1]"), external=0.05),),
    measure=measure))
