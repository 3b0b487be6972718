"""grad_norm: exploding gradients (`actor/grad_norm`): turn gradient clipping on at `grad_clip_on_alarm` when it is
off, unknown or looser."""

from __future__ import annotations

from klguard.fields import greater
from klguard.guard.actions import Action
from klguard.guard.registry import GuardRule, Key, register
from klguard.guard.signals import GRAD_CLIP, GRAD_NORM
from klguard.guard.step import Step

NAME = "grad_norm"


def measure(step: Step) -> None:
    clip, norm = step.value(GRAD_CLIP), step.value(GRAD_NORM)
    if clip is not None:  # the clip the run uses, as it logs it
        step.st.grad_clip = clip
    step.st.alarms[NAME] = norm is not None and norm > step.cfg.grad_norm_max


def act(step: Step) -> list[Action]:
    st, cfg, norm = step.st, step.cfg, step.value(GRAD_NORM)
    clip, target = st.grad_clip, cfg.grad_clip_on_alarm
    if not st.alarms[NAME] or (clip is not None and 0 < clip <= target):
        return []
    st.grad_clip = target
    state = "unknown" if clip is None else ("off" if clip <= 0 else f"{clip:.4g}")
    reason = (f"actor/grad_norm {norm:.4g} is above {cfg.grad_norm_max:.4g}: set gradient clipping to {target:.4g} "
              f"(was {state}).")
    return [Action("set_grad_clip", reason, GRAD_NORM, norm, cfg.grad_norm_max, clip, target, step.step, NAME)]


register(GuardRule(
    name=NAME, kind="alarm", order=20, reads=((GRAD_NORM,),), optional=(GRAD_CLIP,),
    says=lambda c: f"actor/grad_norm > {c.grad_norm_max:g}: clip", sees="exploding gradients",
    actions=("set_grad_clip",), do="clip the gradient norm (1.0 is usual) and watch whether the spikes recur",
    keys=(Key("grad_norm_max", 10.0, "actor/grad_norm above this: tighten grad clipping", greater(0)),
          Key("grad_clip_on_alarm", 1.0, "Gradient clip set when grad_norm alarms", greater(0))),
    measure=measure, act=act))
