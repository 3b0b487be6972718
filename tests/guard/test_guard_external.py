"""The guard's settings for hosts that run another trainer's model (TRL, verl, `klguard watch`): patience on the KL
limit, non-finite inputs, a length collapse judged after the start-up; klguard's own defaults leave all three as they
were."""

from __future__ import annotations

import math

from klguard.config.restricted import load_restricted, with_host_defaults
from klguard.guard import GuardConfig, KLGuard
from klguard.guard.config import EXTERNAL_HOST_DEFAULTS


def decisions(cfg: GuardConfig, rows: list[dict[str, float]]) -> list[tuple[int, str, str]]:
    guard = KLGuard(cfg, total_steps=0)
    out = []
    for step, metrics in enumerate(rows, start=1):
        out += [(a.step, a.kind, a.rule) for a in guard.observe(step, metrics) if a.kind in ("rollback", "pause")]
    return out


def external(**extra) -> GuardConfig:
    overrides = with_host_defaults([f"guard.{k}={v}" for k, v in extra.items()], EXTERNAL_HOST_DEFAULTS)
    return load_restricted(overrides, ("guard.",), who="test", elsewhere="").guard


def test_klguards_defaults_stop_at_the_first_step_above_the_limit_and_ignore_nan_and_length():
    cfg = GuardConfig()
    assert (cfg.kl_hard_patience, cfg.nonfinite_patience, cfg.length_collapse_ratio) == (1, 0, 0.0)
    assert decisions(cfg, [{"actor/kl_loss": 0.01}] * 3 + [{"actor/kl_loss": 0.2}]) == [(4, "rollback", "kl_hard")]
    nan = [{"actor/grad_norm": math.nan, "response_length/mean": 50.0 if s == 0 else 1.0} for s in range(6)]
    assert decisions(cfg, nan) == []


def test_external_hosts_wait_for_a_kl_that_stays_up():
    cfg = external()
    spike = [{"actor/kl_loss": 0.02}] * 5 + [{"actor/kl_loss": 0.9}] + [{"actor/kl_loss": 0.02}] * 5
    assert decisions(cfg, spike) == []
    blowup = [{"actor/kl_loss": 0.02}] * 5 + [{"actor/kl_loss": 0.6}] * 3
    assert decisions(cfg, blowup) == [(8, "rollback", "kl_hard")]
    assert decisions(external(kl_hard_limit=0.7), blowup) == []  # the user's key wins over the host's default


def test_external_hosts_pause_on_nan_gradients_and_roll_back_a_length_collapse():
    cfg = external()
    nan = [{"actor/grad_norm": math.nan}] * 3
    assert decisions(cfg, nan) == [(3, "pause", "nonfinite")]
    assert decisions(cfg, [{"actor/grad_norm": math.nan}, {"actor/grad_norm": 1.0}] * 3) == []
    lengths = [{"response_length/mean": v} for v in [60.0] * 20 + [40.0, 16.0, 9.0, 9.0]]
    # the baseline is steps 11-20's median (60; steps 1-10 are the start-up); the median of the last 5 goes below 15
    # at step 23 (60, 60, 40, 16, 9 -> 40; 60, 40, 16, 9, 9 -> 16 at step 24)
    assert decisions(cfg, lengths) == []
    assert decisions(cfg, [*lengths, {"response_length/mean": 9.0}]) == [(25, "rollback", "length_collapse")]
