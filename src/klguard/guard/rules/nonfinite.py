"""nonfinite: a NaN or infinite gradient norm, loss, KL or score for `nonfinite_patience` steps in a row: pause,
before any other decision (the other rules read such a value as missing: a run whose gradients are NaN would look
calm). Off at 0, klguard's own default (its trainer skips such steps)."""

from __future__ import annotations

import math

from klguard.fields import at_least
from klguard.guard.actions import Action
from klguard.guard.registry import GuardRule, Key, register
from klguard.guard.signals import GRAD_NORM, PG_LOSS, PPO_KL, REF_KL, REF_KL_LOSS, SCORE
from klguard.guard.step import Step

NAME = "nonfinite"
NONFINITE_INPUTS = (GRAD_NORM, PG_LOSS, PPO_KL, REF_KL, REF_KL_LOSS, SCORE)


def stop(step: Step) -> Action | None:
    patience, memory = step.cfg.nonfinite_patience, step.memory(NAME)
    if patience <= 0:
        return None
    bad = [name for name in NONFINITE_INPUTS if _nonfinite(step.metrics.get(name))]
    memory["streak"] = memory["streak"] + 1 if bad else 0
    if not bad or memory["streak"] < patience:
        return None
    return Action("pause", f"{bad[0]} is {step.metrics[bad[0]]} for {memory['streak']} steps in a row: the update is "
                  "not a number, pause the run.", bad[0], None, None, None, None, step.step, NAME)


def _nonfinite(value: object) -> bool:
    return isinstance(value, float) and not math.isfinite(value)


register(GuardRule(
    name=NAME, kind="check", order=10, reads=(NONFINITE_INPUTS,),
    says=lambda c: f"NaN/inf gradient norm, loss, KL or score for {c.nonfinite_patience} steps: pause",
    sees="NaN or infinite training", actions=("pause",),
    keys=(Key("nonfinite_patience", 0, "Consecutive steps with a NaN/inf grad norm, loss, KL or score: pause (0: off, "
              "the trainer skips them)", at_least(0), external=3),),
    do="lower the lr, check the reward for NaN and the precision (fp16 loss scaling), resume from the last finite "
       "checkpoint",
    memory={"streak": 0}, on=lambda guard: guard.cfg.nonfinite_patience > 0,
    hint="lower {lr}, check the reward for NaN and the precision (fp16 loss scaling), or set "
         "{guard}nonfinite_patience=0", stop=stop))
