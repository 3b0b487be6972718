"""length_growth: `response_length/mean` above (1 + `length_growth_max`) x its baseline: responses growing long."""

from __future__ import annotations

from klguard.fields import at_least
from klguard.guard.registry import GuardRule, Key, register
from klguard.guard.signals import LENGTH
from klguard.guard.step import Evidence, Step

NAME = "length_growth"


def measure(step: Step) -> Evidence | None:
    length0, length = step.baseline("length", step.obs.length), step.obs.length
    grow = length0 is not None and length0 > 0 and length is not None
    limit = (1 + step.cfg.length_growth_max) * length0 if grow else None
    fired = step.st.hack[NAME] = limit is not None and length > limit
    return Evidence(NAME, LENGTH, length, limit, f"response length {length:.3g} is over {limit:.3g}") if fired else None


register(GuardRule(
    name=NAME, kind="signal", order=110, reads=((LENGTH,),), default_on=True,
    says=lambda c: f"response length > {1 + c.length_growth_max:g}x its first {c.baseline_window} steps: hacking",
    sees="responses growing long",
    keys=(Key("length_growth_max", 0.5, "response_length/mean above (1 + this) x baseline: hacking signal (at 0.75 a "
              "run-on minority leaks 0.26)", at_least(0)),),
    measure=measure))
