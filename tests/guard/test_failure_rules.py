"""The rules for the failures people report on other trainers' models (on by EXTERNAL_HOST_DEFAULTS, off in klguard's
own runs), each on hand-written samples on both sides of its threshold, and the robust statistics they use."""

from __future__ import annotations

import pytest

from klguard.config.restricted import load_restricted, with_host_defaults
from klguard.guard import GuardConfig, KLGuard
from klguard.guard.config import EXTERNAL_HOST_DEFAULTS
from klguard.guard.trend import mann_kendall, one_sided_p, theil_sen

NEW = ("entropy_blowup", "reward_collapse", "loss_explosion", "policy_ratio", "truncation", "zero_std", "zero_grad",
       "proxy_correctness")


def external(**extra) -> GuardConfig:
    overrides = with_host_defaults([f"guard.{k}={v}" for k, v in extra.items()], EXTERNAL_HOST_DEFAULTS)
    return load_restricted(overrides, ("guard.",), who="test", elsewhere="").guard


def run(rows: list[dict], cfg: GuardConfig | None = None) -> list[tuple[int, str, str]]:
    guard = KLGuard(cfg or external(), total_steps=0)
    out = []
    for step, metrics in enumerate(rows, start=1):
        out += [(a.step, a.kind, a.rule) for a in guard.observe(step, metrics)]
    return out


def first(rows: list[dict], rule: str, cfg: GuardConfig | None = None) -> tuple[int, str] | None:
    return next(((s, k) for s, k, r in run(rows, cfg) if r == rule), None)


def test_klguards_own_runs_have_them_off():
    guard = KLGuard(GuardConfig(), total_steps=0)
    assert not any(r.active(guard) for r in __import__("klguard.guard.registry", fromlist=["x"]).rules()
                   if r.name in NEW)


def test_entropy_blowup_rolls_back_above_8x_its_baseline():
    calm = [{"actor/entropy": 0.3}] * 25
    assert first(calm + [{"actor/entropy": 2.3}] * 5, "entropy_blowup") is None  # 7.7x
    assert first(calm + [{"actor/entropy": 2.5}] * 5, "entropy_blowup") == (28, "rollback")  # 8.3x, median of 5
    assert first([{"actor/entropy": 9.0}] * 3 + calm, "entropy_blowup") is None  # a start-up spike is no baseline


def test_reward_collapse_rolls_back_below_035x_its_plateau():
    plateau = [{"critic/score/mean": 0.8}] * 40
    assert first(plateau + [{"critic/score/mean": 0.3}] * 20, "reward_collapse") is None  # 0.375x
    assert first(plateau + [{"critic/score/mean": 0.2}] * 20, "reward_collapse") == (58, "rollback")  # 18 low steps
    noisy = [{"critic/score/mean": v} for v in [1.0, 0.0] * 40]  # a batch of a few prompts: 0 or 1, mean 0.5
    assert first(noisy, "reward_collapse") is None


def test_loss_explosion_advises_above_30x_its_baseline():
    base = [{"actor/pg_loss": 0.1 * (-1) ** s} for s in range(25)]
    assert first(base + [{"actor/pg_loss": -2.9}] * 5, "loss_explosion") is None
    assert first(base + [{"actor/pg_loss": -40.0}] * 5, "loss_explosion") == (28, "warn")
    zero = [{"actor/pg_loss": 0.0}] * 25  # GRPO's loss is 0 by construction: the floor 0.1 is the baseline
    assert first(zero + [{"actor/pg_loss": 2.0}] * 5, "loss_explosion") is None


def test_policy_ratio_advises_far_from_1_either_way():
    assert first([{"actor/policy_ratio": r} for r in (1.0, 2.5, 0.5, 1.2, 2.9)] * 4, "policy_ratio") is None
    assert first([{"actor/policy_ratio": 0.2}] * 5, "policy_ratio") == (1, "warn")
    assert first([{"actor/policy_ratio": 4.0}] * 5, "policy_ratio") == (1, "warn")


def test_truncation_advises_when_most_responses_are_cut():
    assert first([{"response_length/clip_ratio": 0.45}] * 10, "truncation") is None
    assert first([{"response_length/clip_ratio": 0.95}] * 10, "truncation") == (1, "warn")


def test_zero_std_advises_and_says_which_way():
    rows = [{"critic/score/frac_zero_std": 0.2, "critic/score/mean": 0.5}] * 5
    assert first(rows, "zero_std") is None
    hard = rows + [{"critic/score/frac_zero_std": 0.9, "critic/score/mean": 0.1}] * 5
    guard = KLGuard(external(), total_steps=0)
    reasons = [a.reason for s, m in enumerate(hard, 1) for a in guard.observe(s, m) if a.rule == "zero_std"]
    assert len(reasons) == 1 and "all-wrong groups, prompts too hard" in reasons[0]


def test_zero_grad_advises_when_half_the_steps_have_no_gradient():
    some = [{"actor/grad_norm": 0.0 if s % 3 == 0 else 0.5} for s in range(20)]  # a third
    assert first(some, "zero_grad") is None
    half = [{"actor/grad_norm": 0.0 if s % 2 == 0 else 0.5} for s in range(20)]
    assert first(half, "zero_grad") == (10, "warn")


def _columns(correct: list[float], proxy: list[float]) -> list[dict]:
    return [{"critic/score/correctness_reward/mean": c, "critic/score/format_reward/mean": p}
            for c, p in zip(correct, proxy, strict=True)]


def test_proxy_correctness_advises_when_correctness_falls_while_the_proxy_holds():
    n = 50
    falling = [0.6 - 0.01 * s + 0.02 * (s % 3) for s in range(n)]
    rising = [0.5 + 0.005 * s for s in range(n)]
    assert first(_columns(falling, rising), "proxy_correctness") == (25, "warn")
    assert first(_columns(rising, rising), "proxy_correctness") is None  # both rise: learning
    assert first(_columns(falling, falling[::1]), "proxy_correctness") is None  # the proxy falls too: no gaming
    named = [{"critic/score/a/mean": c, "critic/score/b/mean": p} for c, p in zip(falling, rising, strict=True)]
    assert first(named, "proxy_correctness") is None  # no name says which is the proxy
    assert first(named, "proxy_correctness", external(proxy_reward="b")) is None  # and none says correct: validation


def test_mann_kendall_and_theil_sen_are_robust():
    assert mann_kendall([1, 2, 3, 4, 5, 6]) == pytest.approx((15 - 1) / (6 * 5 * 17 / 18) ** 0.5)
    assert mann_kendall([1, 2, 100, 3, 4, 5, 6, 7]) > 1.645  # one outlier does not hide a rise
    assert mann_kendall([3, 3, 3, 3]) == 0.0 and mann_kendall([1, 2]) == 0.0
    assert theil_sen([0, 1, 2, 3, 4], [0, 1, 2, 50, 4]) == pytest.approx(1.0)
    assert one_sided_p(1.645) == pytest.approx(0.05, abs=1e-3)
