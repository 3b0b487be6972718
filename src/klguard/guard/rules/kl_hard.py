"""kl_hard: the KL to the reference (per token) above the hard limit for `kl_hard_patience` steps: roll back."""

from __future__ import annotations

from klguard.fields import at_least, greater
from klguard.guard.registry import GuardRule, Key, register
from klguard.guard.signals import REF_KL, REF_KL_LOSS
from klguard.guard.step import Step, Trigger

NAME = "kl_hard"


def measure(step: Step) -> None:
    kl, memory = step.obs.kl, step.memory(NAME)
    if kl is None:
        step.st.alarms[NAME] = False
        return
    memory["streak"] = memory["streak"] + 1 if kl > step.cfg.kl_hard_limit else 0
    step.st.alarms[NAME] = memory["streak"] >= step.cfg.kl_hard_patience


def trigger(step: Step) -> Trigger | None:
    obs, cfg = step.obs, step.cfg
    if not step.st.alarms[NAME] or obs.kl is None:
        return None
    steps = f" for {step.memory(NAME)['streak']} steps" if cfg.kl_hard_patience > 1 else ""
    return Trigger(NAME, obs.kl_name, obs.kl, cfg.kl_hard_limit,
                   f"{obs.kl_name} {obs.kl:.4g} is above the hard limit {cfg.kl_hard_limit:.4g}{steps}")


register(GuardRule(
    name=NAME, kind="alarm", order=40, reads=((REF_KL, REF_KL_LOSS),),
    says=lambda c: f"KL to the reference > {c.kl_hard_limit:g} for {c.kl_hard_patience} steps: roll back",
    sees="a KL blow-up", actions=("rollback",),
    keys=(Key("kl_hard_limit", 0.1, "KL to the reference above this: roll back (healthy early learning on the demo "
              "reaches 0.05)", greater(0), external=0.5),
          Key("kl_hard_patience", 1, "Consecutive steps with KL above kl_hard_limit before it rolls back (1: the "
              "first such step)", at_least(1), external=3)),
    memory={"streak": 0}, rolls_back=True, hint="raise {kl_coef} or {guard}kl_hard_limit",
    do="go back to the last checkpoint below the limit and raise the KL coefficient (or lower the lr)",
    measure=measure, trigger=trigger))
