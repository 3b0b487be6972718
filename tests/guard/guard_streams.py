"""Scripted metric streams for the guard tests (a helper module, imported by the test files)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from klguard.guard import Action, GuardConfig, KLGuard

QUIET: dict[str, float] = {
    "actor/ppo_kl": 0.005,  # max 0.025
    "actor/reward_kl_penalty": 0.01,  # target 0.015, hard limit 0.05
    "actor/reward_kl_penalty_coeff": 0.1,
    "actor/kl_seq_sum": 0.1,  # share 0.1 * 0.1 / 1.0 = 1% (max 20%)
    "critic/score/mean": 1.0,
    "actor/grad_norm": 1.0,  # max 10
    "actor/grad_clip": 1.0,
    "actor/lr": 1e-4,
    "response_length/mean": 10.0,
    "actor/entropy": 1.0,
    "hacking/length_reward_corr": 0.1,
}
"""A step on which no rule fires."""

Stream = Iterable[tuple[int, Mapping[str, float]]]


def steps(overrides: Mapping[int, Mapping[str, float]], n: int, start: int = 1,
          base: Mapping[str, float] | None = None) -> list[tuple[int, dict[str, float]]]:
    """Steps start..n: QUIET, then `base` (metrics every step adds), then the given per-step overrides."""
    return [(s, {**QUIET, **(base or {}), **overrides.get(s, {})}) for s in range(start, n + 1)]


class Driver:
    """Feeds a guard a stream and, like a trainer, applies the kl_coef it asks for to later metrics."""

    def __init__(self, guard: KLGuard, beta: float = QUIET["actor/reward_kl_penalty_coeff"]) -> None:
        self.guard, self.beta = guard, beta
        self.log: dict[int, list[Action]] = {}
        self.metrics: dict[int, dict[str, float]] = {}

    def run(self, stream: Stream) -> dict[int, list[Action]]:
        for step, metrics in stream:
            metrics = dict(metrics)
            if "actor/reward_kl_penalty_coeff" in metrics:
                metrics["actor/reward_kl_penalty_coeff"] = self.beta
            actions = self.guard.observe(step, metrics)
            for a in actions:
                if a.kind in ("raise_kl_coef", "freeze_kl_coef", "release_kl_coef") and a.new is not None:
                    self.beta = a.new
            self.log[step] = actions
            self.metrics[step] = self.guard.guard_metrics()
        return self.log

    def kinds(self, step: int) -> list[str]:
        return [a.kind for a in self.log.get(step, [])]

    def fired(self) -> dict[int, list[str]]:
        """Steps with actions -> their kinds."""
        return {s: [a.kind for a in acts] for s, acts in self.log.items() if acts}


SEED_THRESHOLDS: dict[str, object] = {
    # the seed document's values where klguard's calibrated defaults differ; the rule tests were
    # written against these numbers, and they exercise every rule (the defaults switch one off)
    "penalty_share_max": 0.2, "kl_hard_limit": 0.05, "rollback_kl_coef_factor": 2.0, "rollback_lr_factor": 1.0,
    "length_growth_max": 0.5, "length_corr_max": 0.5, "hacking_action": "raise_kl_coef",
    "reanchor_on_rollback": False, "val_patience": 1,
}


def seed_config(**cfg: object) -> GuardConfig:
    return GuardConfig(**{**SEED_THRESHOLDS, **cfg})


def make(total_steps: int = 100, target_kl: float = 0.015, kl_coef: float | None = 0.1, **cfg: object) -> Driver:
    """A Driver around a fresh guard with the seed's thresholds overridden by ``cfg``."""
    guard = KLGuard(seed_config(**cfg), total_steps=total_steps, target_kl=target_kl, kl_coef=kl_coef)
    return Driver(guard, beta=QUIET["actor/reward_kl_penalty_coeff"] if kl_coef is None else kl_coef)


def watch_signals(signals: list[str], base: Mapping[str, float], over: Mapping[int, Mapping[str, float]],
                  n: int = 11, **cfg: object) -> Driver:
    """A guard that measures the hacking `signals` (acting on none) over n steps of QUIET + `base` + `over`."""
    d = make(hacking_action="none", hacking_signals=signals, **cfg)
    d.run(steps(over, n, base=base))
    return d
