"""KL estimators: hand values, straight-through gradients, stability and Monte-Carlo bias."""

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from klguard.algo.kl import KL_ESTIMATORS, kl_penalty

FAST = settings(max_examples=100, deadline=None)
BASES = ("kl", "k1", "abs", "mse", "k2", "low_var_kl", "k3")

# d = logprob - ref = [0.5, -1.0, 0.0, -2.0]
LOGPROB = torch.tensor([-1.0, -2.0, -0.5, -3.0], dtype=torch.float64)
REF = torch.tensor([-1.5, -1.0, -0.5, -1.0], dtype=torch.float64)
E = math.e
K3 = [
    math.exp(-0.5) + 0.5 - 1,  # 0.60653 - 0.5 = 0.10653
    E + (-1.0) - 1,  # e - 2 = 0.71828
    0.0,  # exp(0) + 0 - 1
    E**2 - 2.0 - 1,  # e^2 - 3 = 4.38906
]
EXPECTED = {
    "kl": [0.5, -1.0, 0.0, -2.0],
    "abs": [0.5, 1.0, 0.0, 2.0],
    "mse": [0.125, 0.5, 0.0, 2.0],  # d^2 / 2
    "low_var_kl": K3,
}
ALIASES = {"k1": "kl", "k2": "mse", "k3": "low_var_kl"}


def test_estimator_names() -> None:
    plus = {f"{b}+" for b in BASES}
    assert set(KL_ESTIMATORS) == {*BASES, *plus}
    assert "full" not in KL_ESTIMATORS and "full+" not in KL_ESTIMATORS  # the full-vocabulary KL is not implemented


@pytest.mark.parametrize("name", BASES)
def test_estimators_by_hand(name: str) -> None:
    expected = torch.tensor(EXPECTED[ALIASES.get(name, name)], dtype=torch.float64)
    torch.testing.assert_close(kl_penalty(LOGPROB, REF, name), expected)


def test_k3_is_clamped_like_verl() -> None:
    d = torch.tensor([30.0, -30.0, 20.0, -5.0])
    out = kl_penalty(d, torch.zeros(4), "k3")
    # d=30 -> clamp(d)=20 -> exp(-20)+19 ~ 19 -> clamp 10; d=-30 -> exp(20)-21 -> 10;
    # d=-5 -> exp(5) - 6 = 142.41 -> 10
    torch.testing.assert_close(out, torch.full((4,), 10.0))


def test_full_and_unknown_estimators_raise() -> None:
    with pytest.raises(ValueError, match="unknown kl estimator 'full'"):
        kl_penalty(LOGPROB, REF, "full")
    with pytest.raises(ValueError, match=r"'k4'.*low_var_kl"):
        kl_penalty(LOGPROB, REF, "k4")
    with pytest.raises(ValueError):
        kl_penalty(LOGPROB, REF, "full+")


@pytest.mark.parametrize("base", BASES)
def test_straight_through_value_and_gradient(base: str) -> None:
    logprob = LOGPROB.clone().requires_grad_(True)
    out = kl_penalty(logprob, REF, f"{base}+")
    torch.testing.assert_close(out.detach(), kl_penalty(LOGPROB, REF, base))
    out.sum().backward()
    # gradient of k2 = d^2 / 2 w.r.t. logprob is d
    torch.testing.assert_close(logprob.grad, LOGPROB - REF)
    # and the ref side gets -d, as for k2
    ref = REF.clone().requires_grad_(True)
    kl_penalty(LOGPROB, ref, f"{base}+").sum().backward()
    torch.testing.assert_close(ref.grad, REF - LOGPROB)


F32_MAX = float(torch.finfo(torch.float32).max)
finite32 = st.floats(-F32_MAX, F32_MAX, allow_nan=False, allow_infinity=False, width=32)


@FAST
@given(st.lists(st.tuples(finite32, finite32), min_size=1, max_size=16))
def test_k3_nonnegative_and_finite_on_extreme_inputs(pairs: list[tuple[float, float]]) -> None:
    lp = torch.tensor([a for a, _ in pairs], dtype=torch.float32)
    ref = torch.tensor([b for _, b in pairs], dtype=torch.float32)
    for name in ("k3", "low_var_kl", "k3+"):
        out = kl_penalty(lp, ref, name)
        assert torch.isfinite(out).all()
        assert (out >= 0).all()
        assert (out <= 10).all()


@FAST
@given(st.floats(-(2.0**-20), 2.0**-20, allow_nan=False, width=32))
def test_k3_nonnegative_near_zero(d: float) -> None:
    # exp(-d) + d - 1 cancels catastrophically near 0; the result must still not dip below 0
    out = kl_penalty(torch.tensor([d]), torch.zeros(1), "k3")
    assert out.item() >= 0.0


def _mc(p: list[float], q: list[float], n: int = 200_000) -> tuple[float, dict[str, torch.Tensor]]:
    pt = torch.tensor(p, dtype=torch.float64)
    qt = torch.tensor(q, dtype=torch.float64)
    exact = float((pt * (pt / qt).log()).sum())
    x = torch.multinomial(pt, n, replacement=True, generator=torch.Generator().manual_seed(0))
    lp, lq = pt.log()[x], qt.log()[x]
    return exact, {k: kl_penalty(lp, lq, k) for k in ("k1", "k2", "k3")}


@pytest.mark.parametrize(
    ("p", "q"),
    [([0.1, 0.2, 0.3, 0.4], [0.15, 0.2, 0.25, 0.4]), ([0.7, 0.1, 0.1, 0.1], [0.1, 0.3, 0.3, 0.3])],
)
def test_monte_carlo_k1_k3_unbiased(p: list[float], q: list[float]) -> None:
    """Tokens ~ p: mean k1 and mean k3 are within 5 standard errors of the exact KL(p || q)."""
    exact, samples = _mc(p, q)
    for name in ("k1", "k3"):
        s = samples[name]
        stderr = float(s.std()) / math.sqrt(s.numel())
        assert abs(float(s.mean()) - exact) < 5 * stderr, name


def test_monte_carlo_k2_biased_but_close_for_close_distributions() -> None:
    """k2 estimates E[d^2]/2, not the KL; for close p, q it is within 10 % of the KL.

    Here KL = 0.01415 and E[d^2]/2 = 0.01321 (a 6.7 % bias), so 10 % is a stated, loose bound; its 3.3 % margin
    (4.7e-4) is 9 standard errors of the mean of n = 200,000 samples (std(d^2/2) = 0.024, stderr 5.4e-5).
    """
    exact, samples = _mc([0.1, 0.2, 0.3, 0.4], [0.15, 0.2, 0.25, 0.4])
    assert abs(float(samples["k2"].mean()) - exact) < 0.10 * exact


def test_straight_through_with_infinite_log_ratio_is_finite() -> None:
    # ref gives the sampled token probability 0: d = +inf; k3 clamps to 10, the gradient is 0
    logprob = torch.tensor([-1.0, -1.0], requires_grad=True)
    ref = torch.tensor([float("-inf"), -3.0])
    out = kl_penalty(logprob, ref, "k3+")
    assert out[0].item() == 10.0
    out.sum().backward()
    # second token: d = 2 -> gradient 2
    torch.testing.assert_close(logprob.grad, torch.tensor([0.0, 2.0]))
