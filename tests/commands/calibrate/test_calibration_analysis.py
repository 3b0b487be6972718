"""The calibration's fit and recommendation on scripted sweeps."""

from __future__ import annotations

import math

import pytest

from klguard.commands.calibrate.analysis import Fit, SweepPoint, fit_gao, recommend


def _gain(kl, a=2.0, b=1.0):
    d = math.sqrt(kl)
    return d * (a - b * math.log(d))


def test_the_fit_recovers_gao_coefficients_exactly():
    points = [(kl, _gain(kl)) for kl in (0.001, 0.01, 0.05, 0.1, 0.5, 1.0, 2.0)]
    fit = fit_gao(points)
    assert fit.a == pytest.approx(2.0, abs=1e-9) and fit.b == pytest.approx(1.0, abs=1e-9)
    assert fit.r2 == pytest.approx(1.0)
    # the maximum of d (a - b ln d) is at ln d = a/b - 1
    assert fit.peak_kl == pytest.approx(math.exp(2 * (2.0 - 1)))
    assert fit.predict(fit.peak_kl) > max(fit.predict(fit.peak_kl * f) for f in (0.8, 1.25))


def test_too_few_points_give_no_fit_and_a_convex_fit_has_no_peak():
    assert fit_gao([(0.1, 0.2), (0.2, 0.3)]) is None
    assert fit_gao([(0.0, 0.1), (0.1, 0.2), (-0.1, 0.0)]) is None  # KL <= 0 is not usable
    assert Fit(1.0, -0.5, 0.9, 5).peak_kl is None


def _point(target, final, hacking):
    return SweepPoint(target, final, final, hacking, target, target, 10.0, 100)


def test_recommendation_maximises_the_fit_among_targets_that_do_not_hack():
    fit = Fit(2.0, 1.0, 0.9, 20)  # peak at KL e^2 ~ 7.4: larger targets score higher
    points = [_point(0.01, 0.8, 0.0), _point(0.02, 0.85, 0.05), _point(0.05, 0.9, 0.5)]
    rec = recommend(points, fit, max_hacking_rate=0.1)
    assert rec.target_kl == 0.02 and rec.feasible == [0.01, 0.02]
    assert "R^2 0.90" in rec.basis


def test_a_poor_fit_falls_back_to_the_best_measured_score():
    points = [_point(0.01, 0.8, 0.0), _point(0.02, 0.7, 0.0), _point(0.05, 0.9, 0.5)]
    rec = recommend(points, Fit(2.0, 1.0, 0.1, 20), max_hacking_rate=0.1)
    assert rec.target_kl == 0.01 and "best measured final score (fit R^2 0.10)" in rec.basis


def test_without_gold_labels_every_target_is_admissible_and_all_hacking_gives_none():
    points = [_point(0.01, 0.8, None), _point(0.05, 0.9, None)]
    assert recommend(points, None, 0.1).target_kl == 0.05
    rec = recommend([_point(0.01, 0.8, 0.5)], None, 0.1)
    assert rec.target_kl is None and rec.basis == "every target_kl that finished hacked above 0.1"
