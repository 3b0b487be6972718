"""The off-support hacking signals (ref_support, ref_nll, rm_outlier, audit_gap) on hand-made metric streams, on both
sides of their thresholds; a run that does not log their inputs never fires them."""

from __future__ import annotations

import pytest
from guard_streams import make, steps, watch_signals

from klguard.guard import GuardConfig
from klguard.guard.state import HACK_SIGNALS

BASE = {"hacking/ref_low_prob_share": 0.02, "hacking/ref_nll": 1.2, "hacking/rm_feature_outlier_share": 0.03,
        "hacking/rm_score": 0.5, "hacking/rm_score_std": 2.0, "hacking/audit_score": -1.0,
        "hacking/audit_score_std": 0.5}


def _run(over: dict, n: int = 11, **cfg):
    return watch_signals(list(HACK_SIGNALS), BASE, over, n, **cfg)


@pytest.mark.parametrize(("share", "fires"), [(0.0701, True), (0.0699, False)])
def test_ref_support_over_its_baseline(share: float, fires: bool) -> None:
    d = _run({11: {"hacking/ref_low_prob_share": share}})  # baseline 0.02 + rise 0.05
    assert d.metrics[11]["guard/hack_ref_support"] == float(fires)
    assert d.kinds(11) == (["warn"] if fires else [])


@pytest.mark.parametrize(("nll", "fires"), [(1.71, True), (1.69, False)])
def test_ref_nll_over_its_baseline(nll: float, fires: bool) -> None:
    d = _run({11: {"hacking/ref_nll": nll}})  # baseline 1.2 + rise 0.5
    assert d.metrics[11]["guard/hack_ref_nll"] == float(fires)
    if fires:
        assert (d.log[11][0].metric, d.log[11][0].threshold) == ("hacking/ref_nll", pytest.approx(1.7))


@pytest.mark.parametrize(("share", "fires"), [(0.0801, True), (0.0799, False)])
def test_rm_outlier_over_its_baseline(share: float, fires: bool) -> None:
    d = _run({11: {"hacking/rm_feature_outlier_share": share}})  # baseline 0.03 + rise 0.05
    assert d.metrics[11]["guard/hack_rm_outlier"] == float(fires)
    assert d.kinds(11) == (["warn"] if fires else [])
    if fires:
        assert (d.log[11][0].metric, d.log[11][0].threshold) == ("hacking/rm_feature_outlier_share",
                                                                 pytest.approx(0.08))


def test_rm_outlier_is_logged_only_by_default() -> None:
    d = watch_signals(list(GuardConfig().hacking_signals), BASE, {11: {"hacking/rm_feature_outlier_share": 0.9}})
    assert d.metrics[11]["guard/hack_rm_outlier"] == 1.0 and d.kinds(11) == []


@pytest.mark.parametrize(("rm", "audit", "gap"), [
    (2.6, -1.0, 1.05),   # the optimised RM gains 1.05 of its std, the audit RM nothing: fires
    (2.6, -0.5, 0.05),   # both gain a std: the gain is shared, no alarm
    (2.4, -1.0, 0.95),   # just under the threshold
    (0.5, -2.0, 2.0),    # the audit RM falls while the optimised RM holds: fires
])
def test_audit_gap_is_the_unshared_gain_in_baseline_stds(rm: float, audit: float, gap: float) -> None:
    d = _run({11: {"hacking/rm_score": rm, "hacking/audit_score": audit}})
    assert d.metrics[11]["guard/audit_gap"] == pytest.approx(gap, abs=1e-9)
    assert d.metrics[11]["guard/hack_audit_gap"] == float(gap > 1.0)


def test_no_signal_fires_while_its_baseline_is_collected() -> None:
    d = _run({s: {"hacking/ref_nll": 9.0, "hacking/ref_low_prob_share": 0.9, "hacking/rm_feature_outlier_share": 0.9}
              for s in range(2, 11)})
    assert all(d.metrics[s]["guard/hack_ref_nll"] == 0.0 for s in range(1, 11))
    assert all(d.metrics[s]["guard/hack_rm_outlier"] == 0.0 for s in range(1, 11))
    assert "guard/audit_gap" not in d.metrics[10]


def test_a_run_without_their_inputs_never_fires_them() -> None:
    d = make(hacking_action="none", hacking_signals=list(HACK_SIGNALS))
    d.run(steps({}, 30))
    assert d.fired() == {}
    assert all(d.metrics[30][f"guard/hack_{n}"] == 0.0 for n in ("ref_support", "ref_nll", "rm_outlier", "audit_gap"))


def test_an_audit_rm_without_spread_gives_no_gap() -> None:
    d = _run({s: {"hacking/audit_score_std": 0.0} for s in range(1, 12)})
    assert "guard/audit_gap" not in d.metrics[11] and d.metrics[11]["guard/hack_audit_gap"] == 0.0


@pytest.mark.parametrize("reanchor", [True, False])
def test_a_reanchored_reference_restarts_the_baselines_measured_against_it(reanchor: bool) -> None:
    d = make(hacking_action="none", hacking_signals=["ref_nll"], reanchor_on_rollback=reanchor)
    d.run(steps({}, 10, base=BASE))  # the ref_nll baseline: 1.2 nats under the initial reference
    d.guard.on_rollback(5)  # (no rollback action needed to test the restore itself)
    assert (d.guard.reference_step == 5) is reanchor
    # under the new reference the samples' NLL is 2.0 from then on: a new baseline, or 0.8 over the old one
    d.run(steps({}, 25, start=11, base={**BASE, "hacking/ref_nll": 2.0}))
    assert d.metrics[25]["guard/hack_ref_nll"] == (0.0 if reanchor else 1.0)
    d.run(steps({26: {"hacking/ref_nll": 2.6}}, 26, start=26, base=BASE))
    assert d.metrics[26]["guard/hack_ref_nll"] == 1.0  # 2.6 > 2.0 + 0.5 against the new baseline too
