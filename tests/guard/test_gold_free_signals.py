"""The gold-free hacking signals added for learned reward models (kl_growth, repetition, rm_spread), on hand-made
metric streams; a signal raises the alarm only when guard.hacking_signals names it."""

from __future__ import annotations

import pytest
from guard_streams import make, steps, watch_signals

ALL = ["length_growth", "length_corr", "entropy_collapse", "proxy_val_divergence", "kl_growth", "repetition",
       "rm_spread"]
BASE = {"hacking/repeated_ngram_share": 0.1, "hacking/rm_ensemble_std": 0.2}


def _run(over: dict, n: int = 11, **cfg):
    return watch_signals(ALL, BASE, over, n, **cfg)


@pytest.mark.parametrize(("kl_seq", "fires"), [(0.31, True), (0.29, False)])
def test_kl_growth_over_its_baseline(kl_seq: float, fires: bool) -> None:
    # baseline 0.1 (QUIET's actor/kl_seq_sum) x factor 3 = 0.3, above the floor kl_growth_min=0.2
    d = _run({11: {"actor/kl_seq_sum": kl_seq}}, kl_growth_min=0.2)
    assert d.kinds(11) == (["warn"] if fires else [])
    assert d.metrics[11]["guard/hack_kl_growth"] == float(fires)
    if fires:
        assert (d.log[11][0].metric, d.log[11][0].threshold) == ("actor/kl_seq_sum", pytest.approx(0.3))


def test_kl_growth_needs_its_floor() -> None:
    # a baseline near 0 (the policy starts at its reference): 10x it is still healthy learning below the floor
    d = _run({s: {"actor/kl_seq_sum": 0.001} for s in range(1, 11)} | {11: {"actor/kl_seq_sum": 0.5}})
    assert d.metrics[11]["guard/hack_kl_growth"] == 0.0  # under kl_growth_min=1.0
    d = _run({s: {"actor/kl_seq_sum": 0.001} for s in range(1, 11)} | {11: {"actor/kl_seq_sum": 1.01}})
    assert d.metrics[11]["guard/hack_kl_growth"] == 1.0


def test_kl_growth_baseline_takes_the_first_steps_where_others_settle() -> None:
    """baseline_settle 10 (a Hugging Face model) keeps other metrics' first 10 steps out of their baselines, not the
    KL per sequence's: it starts at 0 because the policy starts as its reference, and those steps are the rise."""
    rising = {s: {"actor/kl_seq_sum": 0.5 * s} for s in range(1, 31)}  # median of steps 1-10: 2.75, x3 = 8.25
    d = _run(rising, n=30, baseline_settle=10, robust_window=1, kl_growth_min=4.0)
    fired = [s for s in range(1, 31) if d.metrics[s]["guard/hack_kl_growth"] == 1.0]
    assert fired[0] == 17, fired  # 8.5 > 8.25 (a baseline of steps 11-20, median 7.75, would wait for 23.25: never)
    assert d.guard._st.baselines["kl_seq"] == [0.5 * s for s in range(1, 11)]


@pytest.mark.parametrize(("share", "fires"), [(0.26, True), (0.24, False)])
def test_repetition_over_its_baseline(share: float, fires: bool) -> None:
    d = _run({11: {"hacking/repeated_ngram_share": share}})  # baseline 0.1 + rise 0.15
    assert d.metrics[11]["guard/hack_repetition"] == float(fires)
    assert d.kinds(11) == (["warn"] if fires else [])


@pytest.mark.parametrize(("spread", "fires"), [(0.41, True), (0.39, False)])
def test_rm_spread_over_its_baseline(spread: float, fires: bool) -> None:
    d = _run({11: {"hacking/rm_ensemble_std": spread}})  # baseline 0.2 x factor 2
    assert d.metrics[11]["guard/hack_rm_spread"] == float(fires)
    assert d.kinds(11) == (["warn"] if fires else [])


def test_a_run_without_an_ensemble_never_fires_rm_spread() -> None:
    d = make(hacking_action="none", hacking_signals=ALL)
    d.run(steps({}, 30))
    assert d.fired() == {} and d.metrics[30]["guard/hack_rm_spread"] == 0.0


def test_a_signal_not_listed_is_logged_but_raises_no_alarm() -> None:
    d = make(hacking_action="none", hacking_signals=["length_growth"])
    d.run(steps({s: BASE for s in range(1, 11)} | {11: {"hacking/rm_ensemble_std": 1.0}}, 11))
    assert d.metrics[11]["guard/hack_rm_spread"] == 1.0
    assert d.metrics[11]["guard/hacking_alarm"] == 0.0 and d.fired() == {} and d.metrics[11]["guard/stable"] == 1.0


def test_an_unknown_signal_is_a_config_error() -> None:
    from klguard.guard import GuardConfig

    with pytest.raises(ValueError, match=r"guard\.hacking_signals='lenght_growth' is not a signal"):
        GuardConfig(hacking_signals=["lenght_growth"]).validate()

