"""zero_grad: steps whose gradient norm is exactly 0 (`actor/grad_norm` == 0) in at least `zero_grad_share` of the last
`zero_grad_window` steps that logged one: the policy is not being updated (every group scored alike, every advantage
is 0, or the loss is masked out). Advice, never a stop. Off in klguard's own runs (0)."""

from __future__ import annotations

from klguard.fields import at_least, interval
from klguard.guard.actions import Action
from klguard.guard.registry import GuardRule, Key, register
from klguard.guard.shapes import advise
from klguard.guard.signals import GRAD_NORM
from klguard.guard.step import Step

NAME = "zero_grad"


def measure(step: Step) -> float | None:
    norm, cfg, zeros = step.value(GRAD_NORM), step.cfg, step.memory(NAME)["zeros"]
    if norm is None or cfg.zero_grad_share <= 0:
        step.st.alarms[NAME] = False
        return None
    zeros.append(norm == 0.0)
    del zeros[:-cfg.zero_grad_window]
    share = sum(zeros) / len(zeros)
    step.st.alarms[NAME] = len(zeros) >= cfg.zero_grad_window and share >= cfg.zero_grad_share
    return share


def act(step: Step) -> list[Action]:
    share, cfg = step.found[NAME], step.cfg
    why = f"{share:.0%} of the last {cfg.zero_grad_window} steps had a gradient norm of exactly 0: no update." \
        if share is not None else ""
    return advise(step, NAME, GRAD_NORM, share, cfg.zero_grad_share, why)


register(GuardRule(
    name=NAME, kind="alarm", flag_when_off=False, order=25, reads=((GRAD_NORM,),),
    says=lambda c: f"actor/grad_norm exactly 0 in {c.zero_grad_share:.0%} of {c.zero_grad_window} steps: advise",
    sees="steps with no gradient", actions=("warn",),
    keys=(Key("zero_grad_share", 0.0, "Share of the last zero_grad_window steps with a gradient norm of exactly 0: "
              "advise (0: off)", interval("[0, 1]"), external=0.5),
          Key("zero_grad_window", 10, "Steps zero_grad counts over", at_least(1))),
    memory={"zeros": []}, on=lambda guard: guard.cfg.zero_grad_share > 0,
    do="check the advantages (all 0 when every group scores alike), the loss mask and the learning-rate schedule",
    measure=measure, act=act))
