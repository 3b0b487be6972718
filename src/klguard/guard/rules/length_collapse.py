"""length_collapse: `response_length/mean` below `length_collapse_ratio` x the mean of its first `baseline_window`
values (those seen so far while they are collected): answers shrunk to a token or two. Roll back. With a start-up
(start_up's `baseline_settle`, on another trainer's model) the median of the last `robust_window` lengths against
the median of the settled baseline, once that baseline is complete."""

from __future__ import annotations

from klguard.fields import interval
from klguard.guard.registry import GuardRule, Key, register
from klguard.guard.signals import LENGTH
from klguard.guard.step import Step, Trigger

NAME = "length_collapse"


def trigger(step: Step) -> Trigger | None:
    """Measured here, after the pause checks: a step that pauses adds nothing to the first values. With a start-up
    (start_up's baseline_settle) it judges the recent median against the length's settled baseline, never before."""
    ratio, length = step.cfg.length_collapse_ratio, step.obs.length
    if ratio <= 0 or length is None:
        return None
    if step.settle > 0:
        base, recent = step.baseline("length", length), step.recent(LENGTH)
        if base is None or recent is None or not recent < ratio * base:
            return None
        return Trigger(NAME, LENGTH, recent, ratio * base, f"response_length/mean {recent:.3g} (the median of the "
                       f"last {step.cfg.robust_window}) collapsed below {ratio:g}x its settled baseline "
                       f"({ratio * base:.3g})")
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
    says=lambda c: (f"response length < {c.length_collapse_ratio:g}x its first steps: roll back"
                    if not c.baseline_settle else f"response length (median of {c.robust_window}) < "
                    f"{c.length_collapse_ratio:g}x its settled baseline: roll back"),
    sees="responses collapsing to a few tokens", actions=("rollback",),
    keys=(Key("length_collapse_ratio", 0.0, "response_length/mean below this x the mean of its first baseline_window "
              "values: roll back (0: off)", interval("[0, 1)"), external=0.25),),
    memory={"base": []}, keep=("base",), rolls_back=True, reanchors=True,
    on=lambda guard: guard.cfg.length_collapse_ratio > 0,
    hint="raise {kl_coef} or lower {lr}, and check the reward for a short-answer exploit",
    do="read a few short responses: a reward that pays short answers is being exploited; raise the KL or lower the lr",
    trigger=trigger))
