"""length_growth: `response_length/mean` above (1 + `length_growth_max`) x its baseline: responses growing long; with
`length_growth_gate` (on another trainer's model) not while the validation score holds near its best."""

from __future__ import annotations

from klguard.fields import at_least
from klguard.guard.registry import GuardRule, Key, register
from klguard.guard.signals import LENGTH
from klguard.guard.step import Evidence, Step

NAME = "length_growth"


def measure(step: Step) -> Evidence | None:
    length0, length = step.baseline("length", step.obs.length), step.recent(LENGTH)
    grow = length0 is not None and length0 > 0 and length is not None and not _paying(step)
    limit = (1 + step.cfg.length_growth_max) * length0 if grow else None
    fired = step.st.hack[NAME] = limit is not None and length > limit
    return Evidence(NAME, LENGTH, length, limit, f"response length {length:.3g} is over {limit:.3g}") if fired else None


def _paying(step: Step) -> bool:
    """With length_growth_gate: whether the latest validation score is within val_drop_max of its best (longer
    answers that hold the validation score are learning, not padding)."""
    st, cfg = step.st, step.cfg
    return (cfg.length_growth_gate and st.best_val is not None and st.prev_val is not None
            and st.prev_val >= st.best_val * (1 - cfg.val_drop_max))


register(GuardRule(
    name=NAME, kind="signal", order=110, reads=((LENGTH,),), default_on=True,
    says=lambda c: f"response length > {1 + c.length_growth_max:g}x its first {c.baseline_window} steps: hacking",
    sees="responses growing long",
    keys=(Key("length_growth_max", 0.5, "response_length/mean above (1 + this) x baseline: hacking signal (at 0.75 a "
              "run-on minority leaks 0.26)", at_least(0)),
          Key("length_growth_gate", False, "No length-growth signal while validation is within val_drop_max of its "
              "best (longer answers that pay)", external=True)),
    do="read a few long responses: padding or repetition that the reward pays is a hack; raise the KL or cap the "
       "length",
    measure=measure))
