"""What a rule sees of one step (the `Step` its measure, stop, trigger and act take), and what it gives back: a
signal's `Evidence`, a rollback's `Trigger`.

A baseline is the mean of a metric's values in its first ``baseline_window`` steps (from the step of its first value):
it is complete once ``baseline_window`` values are in, or once ``baseline_window`` steps have passed since the first
value, so a metric logged every 10 steps has a baseline of one value at its second logging. No signal fires while
its baseline is being collected.

With ``baseline_settle`` > 0 (the start_up rule's key; on another trainer's model) a metric's first
``baseline_settle`` steps are its start-up transient: no baseline takes them, the window starts after them, and the
baseline is the median of the window's values, so a base model's first-step swing (38 -> 384 -> 23 tokens) is
neither the baseline nor judged against it. `recent` is what those rules judge: the median of a metric's last
``robust_window`` values (1: the step's own value).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from klguard.guard.actions import Action
from klguard.guard.signals import Observation, median


@dataclass(frozen=True)
class Evidence:
    """One active hacking signal, for the reason and fields of the resulting action."""

    signal: str
    metric: str
    value: float | None
    threshold: float | None
    text: str


@dataclass(frozen=True)
class Trigger:
    """A reason to roll back: the rule, the metric, its value and limit, and the sentence that says why."""

    rule: str
    metric: str | None
    value: float | None
    threshold: float | None
    why: str


@dataclass(frozen=True)
class Validation:
    """A step's validation score beside the best and the previous one before it (all None on a step without one)."""

    val: float | None = None
    best: float | None = None  # the best before this step's score (this score at the first validation)
    prev: float | None = None


class Step:
    """One step as the rules see it: `cfg` (GuardConfig), `st` (GuardState), `obs` (its metrics), `step`, `metrics`
    (as given, non-finite values included), `kl_controlled`, `validation`; `found[name]` holds what each rule's
    measure returned."""

    def __init__(self, cfg: Any, st: Any, obs: Observation, step: int, metrics: Mapping[str, Any],
                 kl_controlled: bool) -> None:
        self.cfg, self.st, self.obs, self.step, self.metrics = cfg, st, obs, step, metrics
        self.kl_controlled = kl_controlled
        self.validation = Validation()
        self.found: dict[str, Any] = {}
        self.last: list[Action] = []  # actions that go after every other of the step (a pause)
        self._baselines: dict[str, Any] = {}
        self._recent: dict[str, float | None] = {}

    def value(self, metric: str) -> float | None:
        return self.obs.get(metric)

    def memory(self, rule: str) -> dict[str, Any]:
        """The rule's own state (its declaration's `memory`), checkpointed with the guard."""
        return self.st.rules[rule]

    def baseline(self, name: str, value: float | None, settle: bool = True) -> float | None:
        """The mean of baseline `name` once it is complete, collecting `value` while it is not (once a step, however
        many rules ask). `settle` False: the metric's first steps are not a transient to wait out but part of what
        the baseline measures (a KL that starts at 0 because the policy starts as the reference); the window starts
        at its first value, and the median still stands for the mean where ``baseline_settle`` > 0."""
        if name not in self._baselines:
            values = self.st.baselines.setdefault(name, [])
            skip = self.settle if settle else 0
            done = not self._collecting(name, values, value is not None, skip)
            if not done and value is not None and not self._settling(name, skip):
                values.append(value)
            robust = self.settle > 0
            self._baselines[name] = None if not done else median(values) if robust else sum(values) / len(values)
        return self._baselines[name]

    @property
    def settle(self) -> int:
        """Steps of a metric's start-up that no baseline takes (guard.baseline_settle; 0 where no rule declares it)."""
        return int(getattr(self.cfg, "baseline_settle", 0))

    def recent(self, metric: str) -> float | None:
        """The median of `metric`'s last ``robust_window`` values, this step's included (None on a step without one;
        the value itself at a window of 1). Once a step, however many rules ask."""
        if metric not in self._recent:
            value, window = self.value(metric), int(getattr(self.cfg, "robust_window", 1))
            if value is None or window <= 1:
                self._recent[metric] = value
            else:
                values = self.st.recent.setdefault(metric, [])
                values.append(value)
                del values[:-window]
                self._recent[metric] = median(values)
        return self._recent[metric]

    def _settling(self, name: str, skip: int) -> bool:
        """Whether baseline `name` is in its metric's start-up (its first `skip` steps)."""
        start = self.st.baseline_start.get(name)
        step = self.st.last_step if self.st.last_step is not None else 0
        return start is not None and step < start + skip

    def score_baseline(self, name: str, mean: float | None, std: float | None) -> tuple[float, float] | None:
        """Like `baseline` for a score's (batch mean, batch std): their means once the baseline is complete."""
        if name not in self._baselines:
            values = self.st.baselines.setdefault(name, [])
            new = mean is not None and std is not None
            done = not self._collecting(name, values, new, self.settle)
            if not done and new:
                values.append([mean, std])
            self._baselines[name] = ((sum(v[0] for v in values) / len(values), sum(v[1] for v in values) / len(values))
                                     if done else None)
        return self._baselines[name]

    def _collecting(self, name: str, values: list, new: bool, skip: int) -> bool:
        """Whether baseline `name` still takes values at this step: until ``baseline_window`` values are in or as
        many steps have passed since its first value's step and the `skip` steps of its start-up. `new`: whether this
        step has a value (its step starts the window when it is the first)."""
        size = self.cfg.baseline_window
        if len(values) >= size:
            return False
        start = self.st.baseline_start.get(name)
        step = self.st.last_step if self.st.last_step is not None else 0
        if start is None:
            if new:
                self.st.baseline_start[name] = step
            return True
        return not values or step < start + skip + size

    def rise(self, signal: str, metric: str, baseline: str, rise: float, what: str) -> Evidence | None:
        """`signal`: `metric` above its baseline (named `baseline`) + `rise`."""
        value = self.value(metric)
        base = self.baseline(baseline, value)
        return self.limit(signal, metric, value, None if base is None else base + rise, True, what)

    def times(self, signal: str, metric: str, baseline: str, factor: float, above: bool,
              what: str) -> Evidence | None:
        """`signal`: `metric` beyond `factor` x its baseline (named `baseline`), once that baseline is > 0: above it,
        or below it when not `above`."""
        value = self.recent(metric)
        base = self.baseline(baseline, self.value(metric))
        return self.limit(signal, metric, value, factor * base if base and base > 0 else None, above, what)

    def limit(self, signal: str, metric: str, value: float | None, limit: float | None, above: bool,
              what: str) -> Evidence | None:
        """Set `signal`'s flag: `value` beyond `limit` (above it, or below it when not `above`); its evidence."""
        fired = limit is not None and value is not None and (value > limit if above else value < limit)
        self.st.hack[signal] = fired
        if not fired:
            return None
        side = "above" if above else "below"
        return Evidence(signal, metric, value, limit, f"{what} {value:.3g} is {side} {limit:.3g}")
