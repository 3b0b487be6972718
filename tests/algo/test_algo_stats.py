"""Masked statistics: hand-computed values and finiteness on degenerate masks.

By-hand values are exact or within an ulp or two: rel_tol=1e-6 on numbers of order 1 is ~8 eps32."""

import math

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from klguard.algo.stats import masked_count, masked_mean, masked_sum, masked_var, masked_whiten
from tolerances import EPS32

FAST = settings(max_examples=50, deadline=None)


def test_masked_sum_and_mean_by_hand() -> None:
    x = torch.tensor([1.0, 2.0, 3.0, 4.0])
    m = torch.tensor([1, 0, 1, 1])
    # 1 + 3 + 4 = 8 over 3 valid entries
    assert masked_sum(x, m).item() == 8.0
    assert masked_count(x, m).item() == 3.0
    assert math.isclose(masked_mean(x, m).item(), 8.0 / 3.0, rel_tol=1e-6)


def test_masked_mean_per_row_with_empty_row() -> None:
    x = torch.tensor([[1.0, 2.0], [3.0, 4.0]])
    m = torch.tensor([[1.0, 0.0], [0.0, 0.0]])
    # row 0: 1 / 1; row 1: nothing valid -> 0 / clamp(0, 1) = 0
    torch.testing.assert_close(masked_mean(x, m, dim=-1), torch.tensor([1.0, 0.0]))
    torch.testing.assert_close(masked_sum(x, m, dim=0), torch.tensor([1.0, 0.0]))


def test_masked_entries_never_leak_inf_or_nan() -> None:
    x = torch.tensor([1.0, float("inf"), float("nan"), 3.0])
    m = torch.tensor([True, False, False, True])
    assert masked_sum(x, m).item() == 4.0
    assert masked_mean(x, m).item() == 2.0
    # var of {1, 3}: mean 2, squared deviations 1 + 1 = 2, unbiased / (2 - 1) = 2
    assert masked_var(x, m).item() == 2.0
    assert torch.isfinite(masked_whiten(x, m)).all()


def test_masked_var_by_hand() -> None:
    x = torch.tensor([1.0, 2.0, 3.0, 4.0, 100.0])
    m = torch.tensor([1, 1, 1, 1, 0])
    # mean 2.5; squared deviations 2.25 + 0.25 + 0.25 + 2.25 = 5; unbiased 5 / 3, biased 5 / 4
    assert math.isclose(masked_var(x, m).item(), 5.0 / 3.0, rel_tol=1e-6)
    assert math.isclose(masked_var(x, m, unbiased=False).item(), 1.25, rel_tol=1e-6)


def test_masked_whiten_by_hand() -> None:
    x = torch.tensor([1.0, 2.0, 3.0, 50.0])
    m = torch.tensor([1, 1, 1, 0])
    # mean 2, unbiased var (1 + 0 + 1) / 2 = 1 -> (x - 2) / 1; the masked entry is set to 0
    torch.testing.assert_close(masked_whiten(x, m), torch.tensor([-1.0, 0.0, 1.0, 0.0]))
    # shift_mean=False adds the mean back: (x - 2) / 1 + 2
    torch.testing.assert_close(masked_whiten(x, m, shift_mean=False), torch.tensor([1.0, 2.0, 3.0, 0.0]))


def test_degenerate_masks_are_finite() -> None:
    x = torch.randn(3, 4)
    none = torch.zeros(3, 4)
    assert masked_sum(x, none).item() == 0.0
    assert masked_mean(x, none).item() == 0.0
    assert masked_var(x, none).item() == 0.0
    assert torch.equal(masked_whiten(x, none), torch.zeros(3, 4))
    one = torch.zeros(3, 4)
    one[1, 2] = 1
    assert masked_var(x, one).item() == 0.0
    # a single valid entry is its own mean: whitens to 0
    assert torch.equal(masked_whiten(x, one), torch.zeros(3, 4))


@FAST
@given(
    rows=st.integers(1, 5),
    cols=st.integers(1, 6),
    seed=st.integers(0, 2**16),
    p_valid=st.sampled_from([0.0, 0.1, 0.5, 1.0]),
)
def test_masked_stats_finite_on_random_masks(rows: int, cols: int, seed: int, p_valid: float) -> None:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(rows, cols, generator=g) * 1e3
    m = torch.rand(rows, cols, generator=g) < p_valid
    m[0] = False  # always at least one all-masked row
    for out in (masked_mean(x, m, dim=-1), masked_sum(x, m, dim=-1), masked_var(x, m), masked_whiten(x, m)):
        assert torch.isfinite(out).all()
    assert masked_mean(x, m, dim=-1)[0].item() == 0.0
    w = masked_whiten(x, m)
    assert torch.equal(w[~m], torch.zeros_like(w[~m]))
    if m.sum() >= 2 and masked_var(x, m) > 1e-3:
        # float32 rounding: x's mean is off by up to n eps32 max|x|, i.e. by `shift` standard deviations, which w's
        # mean keeps (plus w's own n-term sum); w's variance is 1 up to the n-term sums (x's inside whiten, w's
        # here, squared once) and a few roundings per entry, the shift squared, and whiten's +1e-8 in the variance.
        # A mean left in (|mean(w)| ~ 1) or a biased variance (off by 1 / (n - 1)) is far outside.
        n, var = int(m.sum()), float(masked_var(x, m))
        shift = n * EPS32 * float(x[m].abs().max()) / var**0.5
        assert abs(masked_mean(w, m).item()) < shift + n * EPS32 * float(w[m].abs().max())
        assert abs(masked_var(w, m).item() - 1.0) < 4 * (n + 2) * EPS32 + 2 * shift**2 + 1e-8 / var
