"""start_up: a run's first steps are not judged against a baseline that is not there yet. A metric's first
`baseline_settle` steps (from its first value) are its start-up transient: no baseline takes them, the baseline is
the median of the `baseline_window` values after them, and the rules that compare a metric with its baseline judge
the median of its last `robust_window` values (klguard.guard.step). Off in klguard's own runs (0 and 1: the mean of
the first steps, each step's value judged alone), where its demo set the thresholds; on another trainer's model a base
model's first steps swing (38 -> 384 -> 23 tokens) before they settle. The KL per sequence is not waited out
(kl_growth's baseline takes its first steps): it starts at 0 because the policy starts as its reference, and its
first steps are the rise kl_growth measures."""

from __future__ import annotations

from klguard.fields import at_least
from klguard.guard.registry import GuardRule, Key, register
from klguard.guard.signals import ENTROPY, LENGTH, SCORE

NAME = "start_up"


register(GuardRule(
    name=NAME, kind="check", order=5, reads=((LENGTH, ENTROPY, SCORE),),
    says=lambda c: (f"a metric's first {c.baseline_settle} steps go into no baseline; baselines are medians, each "
                    f"judged value the median of the last {c.robust_window}"),
    sees="a start-up transient taken for a baseline",
    keys=(Key("baseline_settle", 0, "A metric's first steps no baseline takes (start-up; not the KL per sequence's); "
              "above 0 baselines are medians",
              at_least(0), external=10),
          Key("robust_window", 1, "Rules comparing a metric with its baseline judge the median of its last this many "
              "values", at_least(1), external=5)),
    on=lambda guard: guard.cfg.baseline_settle > 0 or guard.cfg.robust_window > 1))
