"""hacking/rm_feature_outlier_share on synthetic Gaussian features: the share near 1 - quantile on fresh draws of the
baseline's distribution and near 1 on shifted ones, nothing before the baseline is complete, the state through a
checkpoint's tensor file, and degenerate input (fewer rollouts than dimensions, no spread, NaN, another width)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from sklearn.covariance import LedoitWolf

from klguard.errors import UserError
from klguard.reward.rm_outliers import METRIC, RMFeatureOutliers, squared_distances
from klguard.runtime.checkpoint import load_tensors, save_tensors

WINDOW, QUANTILE = 10, 0.99


class Features:
    """Correlated Gaussian features [n, dims] (a fixed random linear map of standard normals, plus an offset)."""

    def __init__(self, dims: int, seed: int = 0) -> None:
        self.rng = np.random.default_rng(seed)
        self.mix = self.rng.normal(size=(dims, dims)) / np.sqrt(dims)
        self.offset = self.rng.normal(size=dims)

    def draw(self, n: int, shift: float = 0.0) -> torch.Tensor:
        """`shift`: in standard deviations of the underlying normals, along every one of them."""
        z = self.rng.normal(size=(n, len(self.offset))) + shift
        return torch.from_numpy((z @ self.mix.T + self.offset).astype(np.float32))


def _fitted(source: Features, rows: int, window: int = WINDOW) -> RMFeatureOutliers:
    tracker = RMFeatureOutliers(window, QUANTILE)
    for _ in range(window):
        assert tracker.update(source.draw(rows)) == {}
    assert tracker.fitted
    return tracker


def test_inliers_are_flagged_at_about_one_minus_the_quantile_and_shifted_features_all() -> None:
    source = Features(dims=8)
    tracker = _fitted(source, rows=200)  # 2,000 baseline rollouts, 250 per dimension
    inliers = tracker.update(source.draw(5000))[METRIC]
    shifted = tracker.update(source.draw(1000, shift=4.0))[METRIC]
    # 1 - 0.99 = 0.01; 5,000 draws have a binomial std of 0.0014 and the quantile of 2,000 its own noise
    assert 0.005 < inliers < 0.02, inliers
    assert shifted > 0.99, shifted


def test_the_fit_is_sklearns_on_half_the_baseline_and_the_threshold_the_other_halfs_quantile() -> None:
    source = Features(dims=6, seed=1)
    tracker = RMFeatureOutliers(3, QUANTILE)
    steps = [source.draw(100) for _ in range(3)]
    for x in steps:
        tracker.update(x)
    baseline = torch.cat(steps).double().numpy()
    reference = LedoitWolf().fit(baseline[0::2])  # the even rows fit; the odd rows set the threshold
    held = baseline[1::2]
    distances = squared_distances(held, tracker.location, tracker.precision)
    # float64 sums of 6 x 6 products at the distances' scale
    np.testing.assert_allclose(distances, reference.mahalanobis(held), rtol=0,
                               atol=36 * np.finfo(np.float64).eps * distances.max())
    assert tracker.threshold == pytest.approx(np.quantile(distances, QUANTILE), rel=1e-12)
    assert (distances > tracker.threshold).mean() == pytest.approx(1 - QUANTILE, abs=1 / len(distances))


def test_no_metric_until_the_baseline_steps_are_in() -> None:
    source = Features(dims=4)
    tracker = RMFeatureOutliers(3, QUANTILE)
    assert [tracker.update(source.draw(20)) for _ in range(3)] == [{}, {}, {}]
    assert tracker.update(None) == {} and tracker.update(torch.zeros(0, 4)) == {}
    assert set(tracker.update(source.draw(20))) == {METRIC}


@pytest.mark.parametrize("steps_before_save", [2, 5])  # collecting the baseline; fitted
def test_the_state_through_a_tensor_file_gives_the_same_metric(tmp_path, steps_before_save: int) -> None:
    source = Features(dims=16, seed=2)
    stream = [source.draw(24, shift=0.5 * (i > 5)) for i in range(9)]
    straight, first = RMFeatureOutliers(4, QUANTILE), RMFeatureOutliers(4, QUANTILE)
    for x in stream[:steps_before_save]:
        straight.update(x), first.update(x)
    save_tensors(first.state_dict(), tmp_path / "rm_outliers.pt")
    resumed = RMFeatureOutliers(4, QUANTILE)
    resumed.load_state_dict(load_tensors(tmp_path / "rm_outliers.pt"))  # weights_only: plain tensors and numbers
    expected = [straight.update(x) for x in stream[steps_before_save:]]
    got = [resumed.update(x) for x in stream[steps_before_save:]]
    assert got == expected and len([e for e in expected if e]) == len(stream) - max(4, steps_before_save)
    assert resumed.threshold == straight.threshold and np.array_equal(resumed.precision, straight.precision)


def test_fewer_baseline_rollouts_than_dimensions_still_fit() -> None:
    source = Features(dims=64, seed=3)
    tracker = _fitted(source, rows=4)  # 40 rollouts, 64 dimensions: the empirical covariance is singular
    assert np.isfinite(tracker.precision).all() and tracker.threshold > 0
    inliers = tracker.update(source.draw(2000))[METRIC]
    assert tracker.update(source.draw(500, shift=4.0))[METRIC] == 1.0
    # cross-fitted: the threshold comes from 20 rollouts the fit did not see, so fresh draws cross it rarely (a
    # threshold from the fitted rollouts themselves flagged 0.84 of them); 20 held rows make its quantile coarse
    assert inliers < 0.25, inliers


def test_features_without_spread_flag_nothing() -> None:
    tracker = RMFeatureOutliers(2, QUANTILE)
    same = torch.ones(5, 3)
    tracker.update(same), tracker.update(same)
    assert tracker.update(same) == {METRIC: 0.0}


def test_non_finite_features_skip_the_step_and_are_not_collected() -> None:
    source = Features(dims=4)
    tracker = RMFeatureOutliers(2, QUANTILE)
    bad = source.draw(10)
    bad[3, 1] = float("nan")
    assert tracker.update(bad) == {} and tracker.steps == 0
    tracker.update(source.draw(10)), tracker.update(source.draw(10))
    bad[3, 1] = float("inf")
    assert tracker.fitted and tracker.update(bad) == {}
    share = tracker.update(source.draw(10))[METRIC]
    assert 0.0 <= share <= 1.0


def test_features_of_another_width_are_one_clear_error() -> None:
    tracker = RMFeatureOutliers(2, QUANTILE)
    tracker.update(torch.randn(5, 4))
    with pytest.raises(UserError, match="features have 6 dimensions, its baseline 4; resume with the reward model"):
        tracker.update(torch.randn(5, 6))
