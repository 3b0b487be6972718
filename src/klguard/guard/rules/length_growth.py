"""length_growth: `response_length/mean` above (1 + `length_growth_max`) x its baseline: responses growing long.

With `length_growth_gate` (on another trainer's model) longer answers are a hacking sign only where a held-out score
says they bought nothing, as rldoctor's length detector asks: the validation score has fallen as val_drop measures a
fall (more than `val_drop_max` below its best at `val_patience` validations in a row). A log with no validation
score cannot tell reasoning from padding: the growth is advice there, never a stop."""

from __future__ import annotations

from klguard.fields import at_least
from klguard.guard.actions import Action
from klguard.guard.registry import GuardRule, Key, register
from klguard.guard.signals import LENGTH
from klguard.guard.step import Evidence, Step

NAME = "length_growth"
UNJUDGED = "no validation score says whether the longer answers pay (reasoning or padding): advise"


def measure(step: Step) -> Evidence | None:
    length0, length = step.baseline("length", step.obs.length), step.recent(LENGTH)
    limit = (1 + step.cfg.length_growth_max) * length0 if length0 is not None and length0 > 0 else None
    over = limit is not None and length is not None and length > limit
    earned = _earned(step)
    fired = step.st.hack[NAME] = over and earned is False
    if over and earned is None:
        step.last += _advise(step, length, limit)
    return Evidence(NAME, LENGTH, length, limit, f"response length {length:.3g} is over {limit:.3g}") if fired else None


def _earned(step: Step) -> bool | None:
    """Whether the longer answers pay: always False without length_growth_gate; with it, True until the validation
    score has fallen as val_drop measures a fall, None while the log has no validation score."""
    st, cfg = step.st, step.cfg
    if not cfg.length_growth_gate:
        return False
    if st.best_val is None:
        return None
    return step.memory("val_drop")["streak"] < cfg.val_patience


def _advise(step: Step, length: float, limit: float) -> list[Action]:
    """A warning, once: the length grew and nothing in the log can judge it (the next steps' growth says no more)."""
    memory = step.memory(NAME)
    if memory["advised"]:
        return []
    memory["advised"] = True
    why = f"response length {length:.3g} is over {limit:.3g}, and {UNJUDGED}."
    return [Action("warn", why, LENGTH, length, limit, None, None, step.step, NAME)]


register(GuardRule(
    name=NAME, kind="signal", order=110, reads=((LENGTH,),), default_on=True,
    says=lambda c: f"response length > {1 + c.length_growth_max:g}x its first {c.baseline_window} steps: hacking"
    + (" once validation falls (none logged: advise)" if c.length_growth_gate else ""),
    sees="responses growing long",
    keys=(Key("length_growth_max", 0.5, "response_length/mean above (1 + this) x baseline: hacking signal (at 0.75 a "
              "run-on minority leaks 0.26)", at_least(0)),
          Key("length_growth_gate", False, "Length growth is a hack only once validation falls as val_drop "
              "measures it; with no validation logged, advice", external=True)),
    do="read a few long responses: padding or repetition that the reward pays is a hack; raise the KL or cap the "
       "length; log a held-out score to tell reasoning from padding",
    memory={"advised": False}, measure=measure))
