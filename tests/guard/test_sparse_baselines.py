"""Hacking baselines of metrics logged every N steps: the values of the metric's first baseline_window steps, so a
sparse metric gets a baseline at its second logging; a metric logged every step keeps its first 10 values."""

from __future__ import annotations

import json

import pytest
from guard_streams import QUIET, Driver, make, seed_config, steps

from klguard.guard import KLGuard
from klguard.guard.state import HACK_SIGNALS

NLL = "hacking/ref_nll"


def sparse(values: dict[int, float], n: int = 40, start: int = 0) -> list[tuple[int, dict[str, float]]]:
    """Quiet steps start..n with `hacking/ref_nll` only at the steps of `values` (an evaluation every N steps)."""
    return steps({s: {NLL: v} for s, v in values.items()}, n, start=start)


def run(stream: list[tuple[int, dict[str, float]]], **cfg: object) -> Driver:
    d = make(hacking_action="none", hacking_signals=list(HACK_SIGNALS), **cfg)
    d.run(stream)
    return d


@pytest.mark.parametrize(("nll", "fires"), [(1.71, True), (1.69, False)])
def test_a_metric_every_10_steps_has_its_first_value_as_baseline(nll: float, fires: bool) -> None:
    d = run(sparse({0: 1.2, 10: nll, 20: nll}))  # baseline 1.2 (step 0's value) + rise 0.5
    assert d.metrics[10]["guard/hack_ref_nll"] == float(fires) == d.metrics[20]["guard/hack_ref_nll"]
    assert [s for s in d.metrics if d.metrics[s]["guard/hack_ref_nll"]] == ([10, 20] if fires else [])
    if fires:
        assert (d.log[10][0].metric, d.log[10][0].value) == (NLL, nll)
        assert d.log[10][0].threshold == pytest.approx(1.7)


def test_the_window_is_the_first_baseline_window_steps_from_the_first_value() -> None:
    # every 5 steps from step 3: steps 3 and 8 are in the first 10 steps (baseline 1.0), step 13 is judged
    d = run(sparse({3: 0.9, 8: 1.1, 13: 1.51, 18: 1.49}, n=20, start=1))
    assert d.guard.state_dict()["baselines"]["ref_nll"] == [0.9, 1.1]
    assert [s for s in d.metrics if d.metrics[s]["guard/hack_ref_nll"]] == [13]
    d = run(sparse({3: 0.9, 8: 1.1, 13: 1.51}, n=20, start=1), baseline_window=11)  # step 13 is in the window
    assert d.guard.state_dict()["baselines"]["ref_nll"] == [0.9, 1.1, 1.51] and not d.fired()


def test_no_signal_fires_before_the_window_ends() -> None:
    d = run(sparse({0: 1.2, 5: 9.0, 9: 9.0, 10: 1.2}))
    assert not d.fired() and d.guard.state_dict()["baselines"]["ref_nll"] == [1.2, 9.0, 9.0]


def test_a_metric_logged_every_step_keeps_its_first_10_values() -> None:
    values = [1.0 + 0.1 * i for i in range(12)]  # steps 1-12; baseline: steps 1-10, mean 1.45
    for last, fires in ((1.96, True), (1.94, False)):
        stream = [(0, {}), *steps({s: {NLL: v} for s, v in enumerate(values, start=1)} | {11: {NLL: last}}, 12)]
        d = run(stream)  # step 0: a validation-only step, as klguard's trainer logs before training
        assert d.guard.state_dict()["baselines"]["ref_nll"] == values[:10]
        assert d.metrics[11]["guard/hack_ref_nll"] == float(fires)
        assert d.metrics[10]["guard/hack_ref_nll"] == 0.0  # step 10 is the baseline's tenth value


def test_every_hacking_baseline_completes_from_sparse_values() -> None:
    sparse_base = {"response_length/mean": 10.0, "actor/entropy": 1.0, "actor/kl_seq_sum": 0.1,
                   "hacking/repeated_ngram_share": 0.1, "hacking/rm_ensemble_std": 0.1,
                   "hacking/ref_low_prob_share": 0.02, NLL: 1.2, "hacking/rm_feature_outlier_share": 0.03,
                   "hacking/rm_score": 0.5, "hacking/rm_score_std": 2.0, "hacking/audit_score": -1.0,
                   "hacking/audit_score_std": 0.5}
    quiet = {k: v for k, v in QUIET.items() if k not in sparse_base}
    stream = [(s, {**quiet, **(sparse_base if s % 10 == 0 else {})}) for s in range(0, 31)]
    d = make(hacking_action="none", hacking_signals=list(HACK_SIGNALS))
    d.run(stream)
    state = d.guard.state_dict()
    names = ("length", "entropy", "kl_seq", "repetition", "rm_spread", "ref_low", "ref_nll", "rm_outlier",
             "rm_score", "audit_score")
    assert state["baseline_start"] == dict.fromkeys(names, 0)
    assert all(len(state["baselines"][n]) == 1 for n in names)
    assert d.metrics[10]["guard/audit_gap"] == 0.0  # both score baselines complete at step 10


def test_a_guard_restored_mid_baseline_matches_an_uninterrupted_one() -> None:
    stream = sparse({0: 1.2, 10: 1.3, 20: 1.8, 30: 1.6, 40: 1.9})
    whole = run(stream)
    assert [s for s in whole.metrics if whole.metrics[s]["guard/hack_ref_nll"]] == [20, 40]
    first = run(stream[:6])  # steps 0-5: the baseline holds one value, its window ends at step 10
    state = json.loads(json.dumps(first.guard.state_dict(), allow_nan=False))
    assert (state["baseline_start"]["ref_nll"], state["baselines"]["ref_nll"]) == (0, [1.2])
    resumed = Driver(KLGuard(seed_config(hacking_action="none", hacking_signals=list(HACK_SIGNALS)),
                             total_steps=100, target_kl=0.5, kl_coef=7.0), beta=first.beta)
    resumed.guard.load_state_dict(state)
    resumed.log, resumed.metrics = dict(first.log), dict(first.metrics)
    resumed.run(stream[6:])
    assert (resumed.log, resumed.metrics) == (whole.log, whole.metrics)
    assert resumed.guard.state_dict() == whole.guard.state_dict()


def test_a_state_without_window_starts_collects_on() -> None:
    first = run(sparse({0: 1.2}, n=5))
    state = first.guard.state_dict()
    del state["baseline_start"]  # a state written before windows had starts: its values so far are kept
    guard = KLGuard(seed_config(hacking_action="none", hacking_signals=list(HACK_SIGNALS)), total_steps=100)
    guard.load_state_dict(state)
    d = Driver(guard)
    d.run(sparse({10: 1.4, 20: 1.85}, n=30, start=6))  # the window restarts at step 10, the first value after it
    assert guard.state_dict()["baselines"]["ref_nll"] == [1.2, 1.4]
    assert [s for s in d.metrics if d.metrics[s]["guard/hack_ref_nll"]] == [20]
    assert d.log[20][0].threshold == pytest.approx(1.8)  # (1.2 + 1.4) / 2 + 0.5
