"""Declarations of a common shape: a hacking signal on a metric that rises over its baseline by a margin (a
`guard.*` key); an alarm that advises while a metric's recent median is above a limit. A rule of either shape is one
call in its file in klguard/guard/rules/."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from klguard.guard.actions import Action
from klguard.guard.registry import GuardRule, Key
from klguard.guard.step import Evidence, Step


def rise_signal(name: str, order: int, metric: str, *, baseline: str, rise: Key, sees: str, what: str,
                unit: str = "", keys: tuple[Key, ...] = (), **more: Any) -> GuardRule:
    """A signal that fires while `metric` is above its baseline (named `baseline` in the guard's state) + the key
    `rise`; `keys`: its other keys, before `rise`; `what` names the metric in the evidence."""

    def measure(step: Step) -> Evidence | None:
        return step.rise(name, metric, baseline, getattr(step.cfg, rise.name), what)

    def says(cfg: Any) -> str:
        return f"{metric} > {getattr(cfg, rise.name):g}{unit} over its first {cfg.baseline_window} steps: hacking"

    return GuardRule(name=name, kind="signal", order=order, reads=((metric,),), says=says, sees=sees,
                     keys=(*keys, rise), measure=measure, **more)


def advise(step: Step, name: str, metric: str, value: float | None, threshold: float | None, why: str) -> list[Action]:
    """A warning (advice, never a stop) while alarm `name` is raised, at most once a cooldown."""
    st, cfg = step.st, step.cfg
    if not st.alarms.get(name) or not st.ready(name, step.step, cfg.cooldown):
        return []
    st.fired(name, step.step)
    return [Action("warn", why, metric, value, threshold, None, None, step.step, name)]


def level_advice(name: str, order: int, metric: str, *, limit: Key, sees: str, what: str, do: str,
                 fold: Callable[[float], float] = float, keys: tuple[Key, ...] = ()) -> GuardRule:
    """An alarm that advises (a warning) while the median of `metric`'s last robust_window values, through `fold`,
    is above the key `limit` (off at 0); `what` names the metric in the warning."""

    def measure(step: Step) -> float | None:
        recent, bound = step.recent(metric), getattr(step.cfg, limit.name)
        value = None if recent is None else fold(recent)
        step.st.alarms[name] = bound > 0 and value is not None and value > bound
        return value

    def act(step: Step) -> list[Action]:
        value, bound = step.found[name], getattr(step.cfg, limit.name)
        return advise(step, name, metric, value, bound, f"{what} {value:.3g} is above {bound:g}.") if value else []

    def says(cfg: Any) -> str:
        return f"{what} > {getattr(cfg, limit.name):g}: advise"

    return GuardRule(name=name, kind="alarm", order=order, flag_when_off=False, reads=((metric,),), says=says,
                     sees=sees, actions=("warn",), keys=(limit, *keys), do=do,
                     on=lambda guard: getattr(guard.cfg, limit.name) > 0, measure=measure, act=act)
