"""entropy_blowup: the mirror of an entropy collapse. `actor/entropy` (the median of its last `robust_window` values)
above `entropy_blowup_factor` x its baseline: the policy is spreading its probability over the vocabulary (random
tokens, text that is no longer language). Roll back. Off in klguard's own runs (0)."""

from __future__ import annotations

from klguard.fields import at_least
from klguard.guard.registry import GuardRule, Key, register
from klguard.guard.signals import ENTROPY
from klguard.guard.step import Step, Trigger

NAME = "entropy_blowup"


def trigger(step: Step) -> Trigger | None:
    factor = step.cfg.entropy_blowup_factor
    if factor <= 0:
        return None
    base, entropy = step.baseline("entropy", step.value(ENTROPY)), step.recent(ENTROPY)
    if base is None or base <= 0 or entropy is None or not entropy > factor * base:
        return None
    return Trigger(NAME, ENTROPY, entropy, factor * base, f"actor/entropy {entropy:.3g} blew up above {factor:g}x its "
                   f"baseline ({base:.3g})")


register(GuardRule(
    name=NAME, kind="check", order=30, reads=((ENTROPY,),),
    says=lambda c: f"actor/entropy > {c.entropy_blowup_factor:g}x its baseline: roll back",
    sees="an entropy blow-up (random tokens)", actions=("rollback",),
    keys=(Key("entropy_blowup_factor", 0.0, "actor/entropy above this x its baseline: roll back (0: off; tune half: "
              "healthy <= 1.06x, failing 18-29x)", at_least(0), external=8.0),),
    rolls_back=True, on=lambda guard: guard.cfg.entropy_blowup_factor > 0,
    hint="lower {lr} or raise {kl_coef}; clip the policy ratio",
    do="go back to a checkpoint before the rise, then lower the lr or clip the policy ratio (an unclipped ratio "
       "lets one batch move the policy far)", trigger=trigger))
