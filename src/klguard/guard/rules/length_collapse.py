"""length_collapse: `response_length/mean` below `length_collapse_ratio` x the mean of its first `baseline_window`
values (those seen so far while they are collected): answers shrunk to a token or two. Roll back."""

from __future__ import annotations

from klguard.fields import interval
from klguard.guard.registry import GuardRule, Key, register
from klguard.guard.signals import LENGTH
from klguard.guard.step import Step, Trigger

NAME = "length_collapse"


def trigger(step: Step) -> Trigger | None:
    """Measured here, after the pause checks: a step that pauses adds nothing to the first values."""
    ratio, length = step.cfg.length_collapse_ratio, step.obs.length
    if ratio <= 0 or length is None:
        return None
    base = step.memory(NAME)["base"]
    threshold = ratio * sum(base) / len(base) if base else None
    if len(base) < step.cfg.baseline_window:
        base.append(length)
    if threshold is None or not length < threshold:
        return None
    return Trigger(NAME, LENGTH, length, threshold, f"response_length/mean {length:.3g} collapsed below {ratio:g}x its "
                   f"first steps' mean ({threshold:.3g})")


register(GuardRule(
    name=NAME, kind="check", order=20, reads=((LENGTH,),),
    says=lambda c: f"response length < {c.length_collapse_ratio:g}x its first steps: roll back",
    sees="responses collapsing to a few tokens", actions=("rollback",),
    keys=(Key("length_collapse_ratio", 0.0, "response_length/mean below this x the mean of its first baseline_window "
              "values: roll back (0: off)", interval("[0, 1)"), external=0.25),),
    memory={"base": []}, keep=("base",), rolls_back=True, reanchors=True,
    on=lambda guard: guard.cfg.length_collapse_ratio > 0,
    hint="raise {kl_coef} or lower {lr}, and check the reward for a short-answer exploit", trigger=trigger))
