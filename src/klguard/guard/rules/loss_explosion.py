"""loss_explosion: the policy loss's size (the median of |`actor/pg_loss`| over the last `robust_window` steps) above
`loss_explosion_factor` x its baseline (the median |loss| after the start-up, at least `loss_explosion_floor`): the
update's objective has run away (an unclipped ratio, advantages without a bound). Advice, never a stop: a
policy-gradient loss is no measure of progress, and its scale differs between trainers. Off in klguard's own runs
(0)."""

from __future__ import annotations

from klguard.fields import at_least
from klguard.guard.actions import Action
from klguard.guard.registry import GuardRule, Key, register
from klguard.guard.shapes import advise
from klguard.guard.signals import PG_LOSS, median
from klguard.guard.step import Step

NAME = "loss_explosion"


def measure(step: Step) -> float | None:
    """The limit, once the baseline is in (None before)."""
    loss, cfg, recent = step.value(PG_LOSS), step.cfg, step.memory(NAME)["recent"]
    step.st.alarms[NAME] = False
    if loss is None or cfg.loss_explosion_factor <= 0:
        return None
    base = step.baseline("pg_loss_size", abs(loss))
    recent.append(abs(loss))
    del recent[:-cfg.robust_window]
    if base is None:
        return None
    limit = cfg.loss_explosion_factor * max(base, cfg.loss_explosion_floor)
    step.st.alarms[NAME] = median(recent) > limit
    return limit


def act(step: Step) -> list[Action]:
    limit, recent = step.found[NAME], step.memory(NAME)["recent"]
    if limit is None:
        return []
    size = median(recent)
    return advise(step, NAME, PG_LOSS, size, limit, f"|actor/pg_loss| {size:.3g} is above {limit:.3g} "
                  f"({step.cfg.loss_explosion_factor:g}x its baseline): the objective is running away.")


register(GuardRule(
    name=NAME, kind="alarm", flag_when_off=False, order=30, reads=((PG_LOSS,),),
    says=lambda c: f"|actor/pg_loss| > {c.loss_explosion_factor:g}x its baseline: advise",
    sees="a loss explosion", actions=("warn",),
    keys=(Key("loss_explosion_factor", 0.0, "|actor/pg_loss| above this x its baseline (at least "
              "loss_explosion_floor): advise (0: off)", at_least(0), external=30.0),
          Key("loss_explosion_floor", 0.1, "The smallest baseline loss_explosion compares with (a GRPO loss is near 0)",
              at_least(0))),
    memory={"recent": []}, on=lambda guard: guard.cfg.loss_explosion_factor > 0,
    do="clip the policy ratio and the advantages, lower the lr; check the loss for a sum where a mean was meant",
    measure=measure, act=act))
