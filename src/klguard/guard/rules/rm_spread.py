"""rm_spread: `hacking/rm_ensemble_std` above `rm_spread_factor` x its baseline: an RM ensemble's members disagree on
the policy's responses more than they did on the starting policy's (Eisenstein et al. 2023)."""

from __future__ import annotations

from klguard.fields import at_least
from klguard.guard.registry import GuardRule, Key, register
from klguard.guard.signals import RM_SPREAD
from klguard.guard.step import Evidence, Step

NAME = "rm_spread"


def measure(step: Step) -> Evidence | None:
    return step.times(NAME, RM_SPREAD, "rm_spread", step.cfg.rm_spread_factor, True, "RM ensemble spread")


register(GuardRule(
    name=NAME, kind="signal", order=160, reads=((RM_SPREAD,),),
    says=lambda c: f"{RM_SPREAD} > {c.rm_spread_factor:g}x its first {c.baseline_window} steps: hacking",
    sees="a reward-model ensemble disagreeing",
    keys=(Key("rm_spread_factor", 2.0, "hacking/rm_ensemble_std (an RM ensemble's spread) above this x baseline: "
              "hacking signal", at_least(1)),),
    measure=measure))
