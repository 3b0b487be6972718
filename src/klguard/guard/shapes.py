"""Declarations of a common shape: a hacking signal on a metric that rises over its baseline by a margin (a
`guard.*` key). A signal of that shape is one call in its file in klguard/guard/rules/."""

from __future__ import annotations

from typing import Any

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
