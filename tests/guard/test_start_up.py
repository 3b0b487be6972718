"""The start-up transient (the start_up rule's keys, on another trainer's model): a base model's first-step swing
(38 -> 384 -> 23 tokens) is neither a baseline nor judged against one; a collapse or growth after the start-up still
is. klguard's own defaults keep the mean of the first steps, each step judged alone."""

from __future__ import annotations

import json

from klguard.config.restricted import load_restricted, with_host_defaults
from klguard.guard import GuardConfig, KLGuard
from klguard.guard.config import EXTERNAL_HOST_DEFAULTS

SWING = [38.0, 384.0, 23.0, 410.0, 120.0, 300.0, 280.0, 350.0, 260.0, 310.0]  # rfs ch. 7's base model, steps 1-10
SETTLED = [300.0, 280.0, 320.0, 290.0, 310.0, 305.0, 295.0, 300.0, 285.0, 315.0]  # steps 11-20: the baseline, 300


def external(**extra) -> GuardConfig:
    overrides = with_host_defaults([f"guard.{k}={v}" for k, v in extra.items()], EXTERNAL_HOST_DEFAULTS)
    return load_restricted(overrides, ("guard.",), who="test", elsewhere="").guard


def stops(cfg: GuardConfig, lengths: list[float], **more: list[float]) -> list[tuple[int, str, str]]:
    """The first rollback or pause (as `klguard watch` stops there)."""
    guard = KLGuard(cfg, total_steps=0)
    out = []
    for step, length in enumerate(lengths, start=1):
        metrics = {"response_length/mean": length, **{k.replace("__", "/"): v[step - 1] for k, v in more.items()}}
        out += [(a.step, a.kind, a.rule) for a in guard.observe(step, metrics) if a.kind in ("rollback", "pause")]
    return out[:1]


def test_a_base_models_first_step_swing_stops_nothing():
    cfg = external()
    assert (cfg.baseline_settle, cfg.robust_window) == (10, 5)
    assert stops(cfg, SWING + SETTLED + [300.0] * 30) == []
    # the same swing with klguard's own reading of a baseline (the mean of the values so far, each step alone)
    assert stops(external(baseline_settle=0, robust_window=1), SWING) == [(3, "rollback", "length_collapse")]


def test_a_collapse_after_the_start_up_is_still_rolled_back():
    cfg = external()
    collapse = SWING + SETTLED + [300.0, 290.0] + [40.0] * 5  # 0.25 x 300 = 75
    assert stops(cfg, collapse) == [(25, "rollback", "length_collapse")]  # the median of the last 5 is 40 at step 25
    one_short_batch = SWING + SETTLED + [300.0, 40.0, 300.0, 310.0, 40.0, 300.0]
    assert stops(cfg, one_short_batch) == []  # one or two short batches in five are no collapse


def test_the_baseline_is_the_median_of_the_values_after_the_start_up():
    guard = KLGuard(external(), total_steps=0)
    for step, length in enumerate(SWING + SETTLED + [300.0], start=1):
        guard.observe(step, {"response_length/mean": length, "actor/entropy": 1.0})
    state = json.loads(json.dumps(guard.state_dict()))
    assert state["baselines"]["length"] == SETTLED  # steps 1-10 went into no baseline
    assert state["recent"]["response_length/mean"] == [295.0, 300.0, 285.0, 315.0, 300.0]
    restored = KLGuard(external(), total_steps=0)
    restored.load_state_dict(state)
    assert restored.state_dict() == guard.state_dict()


def test_klguards_own_defaults_are_unchanged():
    cfg = GuardConfig()
    assert (cfg.baseline_settle, cfg.robust_window, cfg.length_growth_gate) == (0, 1, False)
    guard = KLGuard(cfg, total_steps=0)
    for step in range(1, 12):
        guard.observe(step, {"response_length/mean": 10.0 + step})
    assert guard.state_dict()["baselines"]["length"] == [11.0 + i for i in range(10)]
    assert guard.state_dict()["recent"] == {}


def decisions(cfg: GuardConfig, lengths: list[float], val: dict[int, float] | None = None) -> list[tuple]:
    """The warnings and the first rollback (step, kind, rule), as `klguard watch` stops there, and the steps whose
    length_growth signal was up."""
    guard, out, up = KLGuard(cfg, total_steps=0), [], []
    for step, length in enumerate(lengths, start=1):
        metrics = {"response_length/mean": length}
        if val and step in val:
            metrics["val-core/math/acc/mean@1"] = val[step]
        out += [(a.step, a.kind, a.rule) for a in guard.observe(step, metrics) if a.kind in ("warn", "rollback")]
        up += [step] if guard.guard_metrics()["guard/hack_length_growth"] else []
        if out and out[-1][1] == "rollback":
            break
    return out, up


GROWTH = SWING + SETTLED + [700.0] * 6  # > 1.5 x 300 from step 23 (the median of the last 5)


def test_length_growth_is_no_hack_while_validation_holds():
    cfg = external()
    assert decisions(cfg, GROWTH, {1: 0.40, 20: 0.50, 25: 0.49}) == ([], [])  # within val_drop_max (10%) of its best
    # one validation 16% below its best is one noisy score (val_drop's val_patience is 2): no hack yet
    assert decisions(cfg, GROWTH, {1: 0.40, 20: 0.50, 25: 0.42}) == ([], [])


def test_length_growth_is_a_hack_once_validation_has_fallen():
    cfg = external()
    fallen, up = decisions(cfg, GROWTH, {1: 0.40, 20: 0.50, 24: 0.42, 25: 0.42})  # two validations in a row 16% below
    assert up == [25] and fallen == [(25, "rollback", "val_drop")]  # val_drop comes first in the rollback order
    still, up = decisions(cfg, GROWTH, {1: 0.40, 20: 0.50, 24: 0.46, 25: 0.46})  # two in a row, 8% below: within
    assert (still, up) == ([], [])


def test_length_growth_without_validation_is_advice():
    cfg = external()
    # no validation: advise once (the growth of the next 20 steps says no more), never stop
    assert decisions(cfg, GROWTH + [700.0] * 20) == ([(23, "warn", "length_growth")], [])
    assert decisions(cfg, SWING + SETTLED + [440.0] * 6) == ([], [])  # under 1.5 x 300: nothing
    own = external(length_growth_gate=False)  # klguard's own reading: a hacking signal, gated by nothing
    assert decisions(own, GROWTH) == ([(23, "rollback", "hacking")], [23])
