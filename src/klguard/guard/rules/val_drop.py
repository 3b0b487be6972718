"""val_drop: the validation score (`guard.val_metric`, gold by default) more than `val_drop_max` below its best at
`val_patience` validations in a row: roll back. Drop = (best - val) / best, only while best > 0."""

from __future__ import annotations

from klguard.fields import at_least
from klguard.guard.registry import GuardRule, Key, register
from klguard.guard.signals import VAL_METRIC
from klguard.guard.step import Step, Trigger

NAME = "val_drop"


def measure(step: Step) -> bool:
    """Whether `val_patience` validations in a row dropped too far (the first such one already raises the alarm, so
    no checkpoint taken then is stable). The alarm lasts until the next validation."""
    val, best, cfg = step.validation.val, step.validation.best, step.cfg
    if val is None:
        return False
    memory = step.memory(NAME)
    dropped = best > 0 and (best - val) / best > cfg.val_drop_max
    step.st.alarms[NAME] = dropped
    memory["streak"] = memory["streak"] + 1 if dropped else 0
    return memory["streak"] >= cfg.val_patience


def trigger(step: Step) -> Trigger | None:
    st, cfg, val = step.st, step.cfg, step.obs.val
    if not step.found[NAME] or st.best_val is None or val is None:
        return None
    return Trigger(NAME, cfg.val_metric, val, st.best_val * (1 - cfg.val_drop_max),
                   f"the validation score {val:.4g} fell more than {cfg.val_drop_max:.0%} below its best "
                   f"{st.best_val:.4g}")


register(GuardRule(
    name=NAME, kind="alarm", order=70, reads=((VAL_METRIC,),), needs_gold=True,
    says=lambda c: f"validation {c.val_drop_max:.0%} below its best: roll back", sees="a validation score falling",
    actions=("rollback",),
    keys=(Key("val_drop_max", 0.05, "Relative drop of the validation score from its best (when > 0) that rolls back",
              at_least(0), external=0.1),),
    do="keep the checkpoint of the best validation; resume from it with a lower lr or a higher KL coefficient",
    memory={"streak": 0}, rolls_back=True, reanchors=True, hint="raise {kl_coef}, lower {lr} or raise "
    "{guard}val_drop_max", measure=measure, trigger=trigger))
