"""Early stopping and grid extension of the calibration sweep, on scripted run records."""

from __future__ import annotations

from pathlib import Path

import pytest

from klguard.commands.calibrate.analysis import SweepPoint
from klguard.commands.calibrate.early_stop import MIN_TARGET, StopRule, next_targets, stop_reason
from klguard.commands.report.runs import RunRecord

GOLD = "val-core/klguard/arith/acc/mean@1"
RULE = StopRule("val-core/", hacking_rate=0.3, hacking_validations=3, behind=0.2, max_hacking_rate=0.1)


def _run(hacking: list[float], gold: dict[int, float], label: str = "run") -> RunRecord:
    """Steps 0..len(hacking): a sampled hacking rate per step, gold at the validation steps given."""
    rows = [{"step": 0, GOLD: gold[0]}]
    for step, rate in enumerate(hacking, 1):
        rows.append({"step": step, "hacking/rate": rate, **({GOLD: gold[step]} if step in gold else {})})
    return RunRecord(label, Path(label), rows)


def _gold(*values: float) -> dict[int, float]:
    return {10 * i: v for i, v in enumerate(values)}


def test_a_run_stops_at_its_third_validation_in_a_row_over_the_hacking_limit():
    hacking = [0.0] * 20 + [0.5] * 40  # the 10-step means at steps 30, 40, 50 are all over 0.3
    reason = stop_reason(_run(hacking, _gold(0.7, 0.8, 0.8, 0.6, 0.4, 0.3, 0.2)), [], RULE)
    assert reason is not None and reason.startswith("hacking rate over 0.3 at 3 validations in a row (step 50: 0.50)")


def test_hacking_between_the_limit_and_the_stopping_rate_does_not_stop_a_run():
    hacking = [0.0] * 20 + [0.25] * 60  # over max_hacking_rate, under stop_hacking_rate: the controller may win
    assert stop_reason(_run(hacking, _gold(0.7, 0.8, 0.8, 0.8, 0.8, 0.8, 0.8, 0.8, 0.8)), [], RULE) is None


def test_two_validations_over_the_limit_then_one_under_do_not_stop_it():
    hacking = [0.0] * 20 + [0.5] * 20 + [0.0] * 10 + [0.5] * 20  # over at 30, 40; under at 50; over at 60, 70
    assert stop_reason(_run(hacking, _gold(0.7, 0.8, 0.8, 0.8, 0.8, 0.8, 0.8, 0.8)), [], RULE) is None


def test_a_run_stops_when_it_falls_far_behind_the_best_clean_run_at_the_same_step():
    leader = _run([0.0] * 30, _gold(0.7, 0.9, 0.95, 0.95), "leader")
    laggard = _run([0.0] * 30, _gold(0.7, 0.75, 0.7, 0.72), "laggard")
    reason = stop_reason(laggard, [leader], RULE)
    assert reason == "score 0.700 at step 20 is 0.25 under the best clean run's 0.950"
    assert stop_reason(leader, [laggard], RULE) is None


def test_a_hacking_run_is_no_yardstick():
    hacker = _run([0.5] * 20, _gold(0.7, 1.0, 1.0), "hacker")  # a score it reached while hacking
    clean = _run([0.0] * 20, _gold(0.7, 0.75, 0.75), "clean")
    assert stop_reason(clean, [hacker], RULE) is None


def test_without_gold_labels_only_the_score_rule_applies():
    rows = [{"step": s, "val-core/rm/score": 0.1 * s} for s in (0, 10, 20)]
    run = RunRecord("rm", Path("rm"), rows)
    assert stop_reason(run, [], StopRule("val-core/rm/score", 0.3, 3, 0.2, 0.1)) is None


def _point(target: float, final: float | None, hacking: float | None) -> SweepPoint:
    return SweepPoint(target, final, final, hacking, target, target, 10.0, 200)


def test_when_every_target_hacks_the_grid_goes_below_the_smallest():
    found = next_targets([_point(0.005, 0.9, 0.3), _point(0.01, 0.3, 0.9)], 0.74, 0.1, 0.01, count=2)
    assert found.targets == (0.0025, 0.00125)
    assert found.reason == "every target_kl hacked down to 0.005"


def test_when_nothing_learns_and_nothing_hacks_the_grid_goes_above_the_largest():
    found = next_targets([_point(0.001, 0.74, 0.0), _point(0.002, 0.745, 0.01)], 0.74, 0.1, 0.01, count=1)
    assert found.targets == (0.004,)
    assert "no target_kl up to 0.002 learned" in found.reason


def test_between_a_clean_target_that_does_not_learn_and_one_that_hacks_it_splits_the_bracket():
    found = next_targets([_point(0.001, 0.74, 0.0), _point(0.004, 0.2, 0.8)], 0.74, 0.1, 0.01, count=1)
    assert found.targets == (0.002,)
    assert found.reason == "0.001 (gain +0.000, hacking 0.00) does not learn, 0.004 (gain -0.540, hacking 0.80) hacks"


def test_a_target_that_learns_without_hacking_ends_the_extension_with_its_bracket():
    found = next_targets([_point(0.005, 0.9, 0.05), _point(0.01, 0.3, 0.9)], 0.74, 0.1, 0.01, count=2)
    assert found.targets == ()
    assert found.reason == ("bracket: 0.005 (gain +0.160, hacking 0.05) learns without hacking; "
                            "0.01 (gain -0.440, hacking 0.90) hacks")


@pytest.mark.parametrize("points", [
    [_point(0.001, 0.74, 0.0), _point(0.0012, 0.3, 0.9)],  # a bracket narrower than 1.25x
    [_point(MIN_TARGET, 0.3, 0.9)],  # nothing below the floor
])
def test_no_extension_says_why_no_target_exists(points):
    found = next_targets(points, 0.74, 0.1, 0.01, count=2)
    assert found.targets == ()
    assert "no target learns without hacking" in found.reason or "the grid stops at" in found.reason


def test_a_run_stopped_early_is_not_the_one_that_learns():
    points = [_point(0.001, 0.74, 0.0), _point(0.002, 0.80, 0.0), _point(0.004, 0.2, 0.8)]
    found = next_targets(points, 0.74, 0.1, 0.01, count=1, stopped={0.002})
    assert found.targets == (0.00283,)  # between 0.002 (stopped, so not learning) and 0.004 (hacks)
