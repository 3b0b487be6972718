"""PPO policy/value losses, aggregation modes, entropy and log-prob helpers.

By-hand values: rel_tol=1e-6 on numbers of order 1 is ~8 eps32; 1e-5 where the inputs are log-probs of |lp| = 2
taken through log and exp, which round at up to 8x the result's scale."""

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from klguard.algo.loss import (
    LOSS_AGG_MODES,
    agg_loss,
    compute_policy_loss,
    compute_value_loss,
    entropy_from_logits,
    logprobs_from_logits,
    ppo_token_losses,
)
from tolerances import float32_tol

FAST = settings(max_examples=100, deadline=None)
T = torch.tensor

LOSS = T([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0], [7.0, 8.0, 9.0]])
LOSS_MASK = T([[1.0, 1.0, 0.0], [1.0, 0.0, 0.0], [0.0, 0.0, 0.0]])  # last row has no valid token


@pytest.mark.parametrize(
    ("mode", "expected"),
    [
        ("token-mean", 7.0 / 3.0),  # (1 + 2 + 4) / 3 tokens
        ("seq-mean-token-sum", 3.5),  # ((1 + 2) + 4) / 2 non-empty sequences
        ("seq-mean-token-mean", 2.75),  # (1.5 + 4) / 2
        ("seq-mean-token-sum-norm", 7.0 / 3.0),  # (1 + 2 + 4) / T=3
    ],
)
def test_agg_loss_by_hand(mode: str, expected: float) -> None:
    assert math.isclose(agg_loss(LOSS, LOSS_MASK, mode).item(), expected, rel_tol=1e-6)
    # every mode is 0, not NaN, when nothing is valid
    assert agg_loss(LOSS, torch.zeros(3, 3), mode).item() == 0.0


def test_agg_loss_norm_constant_and_errors() -> None:
    # (1 + 2 + 4) / 7
    assert math.isclose(agg_loss(LOSS, LOSS_MASK, "seq-mean-token-sum-norm", norm_constant=7).item(), 1.0)
    with pytest.raises(ValueError, match="norm_constant"):
        agg_loss(LOSS, LOSS_MASK, "seq-mean-token-sum-norm", norm_constant=0)
    with pytest.raises(ValueError, match=r"'seq-sum'.*token-mean"):
        agg_loss(LOSS, LOSS_MASK, "seq-sum")
    assert set(LOSS_AGG_MODES) == {
        "token-mean",
        "seq-mean-token-sum",
        "seq-mean-token-mean",
        "seq-mean-token-sum-norm",
    }


def test_agg_loss_ignores_nan_in_padding() -> None:
    loss = LOSS.clone()
    loss[2] = float("nan")
    for mode in LOSS_AGG_MODES:
        assert torch.isfinite(agg_loss(loss, LOSS_MASK, mode))


# Five valid tokens and one masked (garbage) token. clip 0.2, clip_ratio_c 3.
ADV = T([[1.0, 1.0, -1.0, -1.0, -1.0, 100.0]])
RATIO = T([[1.5, 0.9, 0.5, 1.1, 5.0, 50.0]])
MASK = T([[1.0, 1.0, 1.0, 1.0, 1.0, 0.0]])
OLD = torch.full((1, 6), -2.0)
NEW = OLD + RATIO.log()
# per token, loss = max(-A r, -A clip(r, 0.8, 1.2)), then for A < 0 min(., 3 |A|):
#   A=+1 r=1.5: max(-1.5, -1.2) = -1.2  clipped
#   A=+1 r=0.9: max(-0.9, -0.9) = -0.9
#   A=-1 r=0.5: max(0.5, 0.8) = 0.8     clipped
#   A=-1 r=1.1: max(1.1, 1.1) = 1.1
#   A=-1 r=5.0: max(5.0, 1.2) = 5.0 -> min(5.0, 3.0) = 3.0  dual-clipped
PER_TOKEN = [-1.2, -0.9, 0.8, 1.1, 3.0]


def test_policy_loss_by_hand() -> None:
    out = compute_policy_loss(OLD, NEW, ADV, MASK)
    assert math.isclose(out.pg_loss.item(), sum(PER_TOKEN) / 5, rel_tol=1e-5)  # 2.8 / 5 = 0.56
    assert math.isclose(out.pg_clipfrac.item(), 2 / 5, rel_tol=1e-6)
    assert math.isclose(out.pg_clipfrac_lower.item(), 1 / 5, rel_tol=1e-6)
    # ppo_kl = mean(old - new) = -ln(1.5 * 0.9 * 0.5 * 1.1 * 5) / 5 = -ln(3.7125) / 5 = -0.262344
    assert math.isclose(out.ppo_kl.item(), -math.log(3.7125) / 5, rel_tol=1e-5)


def test_policy_loss_without_dual_clip() -> None:
    # the last valid token keeps its loss 5.0: (-1.2 - 0.9 + 0.8 + 1.1 + 5.0) / 5 = 0.96
    out = compute_policy_loss(OLD, NEW, ADV, MASK, use_dual_clip=False)
    assert math.isclose(out.pg_loss.item(), 0.96, rel_tol=1e-5)
    assert out.pg_clipfrac_lower.item() == 0.0


def test_policy_loss_asymmetric_clip() -> None:
    # clip_ratio_high 0.28: token 0 -> max(-1.5, -1.28) = -1.28; low 0.4: token 2 ->
    # max(0.5, 0.6) = 0.6. Sum -1.28 - 0.9 + 0.6 + 1.1 + 3.0 = 2.52
    out = compute_policy_loss(OLD, NEW, ADV, MASK, clip_ratio_low=0.4, clip_ratio_high=0.28)
    assert math.isclose(out.pg_loss.item(), 2.52 / 5, rel_tol=1e-5)


@pytest.mark.parametrize(
    ("mode", "expected"),
    [
        ("token-mean", 2.8 / 5),
        ("seq-mean-token-sum", 2.8),  # one sequence
        ("seq-mean-token-mean", 2.8 / 5),
        ("seq-mean-token-sum-norm", 2.8 / 6),  # / padded length 6
    ],
)
def test_policy_loss_agg_modes(mode: str, expected: float) -> None:
    out = compute_policy_loss(OLD, NEW, ADV, MASK, loss_agg_mode=mode)
    assert math.isclose(out.pg_loss.item(), expected, rel_tol=1e-5)


def test_policy_loss_gradients() -> None:
    new = NEW.clone().requires_grad_(True)
    compute_policy_loss(OLD, new, ADV, MASK, loss_agg_mode="seq-mean-token-sum").pg_loss.backward()
    # d(-A r)/d logprob = -A r where the unclipped term is active; 0 where clipped, dual-clipped
    # or masked: tokens 1 (-0.9) and 3 (1.1) only
    torch.testing.assert_close(new.grad, T([[0.0, -0.9, 0.0, 1.1, 0.0, 0.0]]))


def test_policy_loss_rejects_bad_clip_ratio_c() -> None:
    for bad in (1.0, 0.5, float("nan")):
        with pytest.raises(ValueError, match="clip_ratio_c"):
            compute_policy_loss(OLD, NEW, ADV, MASK, clip_ratio_c=bad)
    with pytest.raises(ValueError, match="clip_ratio_low"):
        compute_policy_loss(OLD, NEW, ADV, MASK, clip_ratio_low=1.0)


@FAST
@given(
    log_ratio=st.lists(st.floats(-30.0, 30.0), min_size=1, max_size=8),
    adv=st.lists(st.floats(-1e3, 1e3), min_size=8, max_size=8),
    clip=st.floats(0.0, 0.9),
    clip_c=st.floats(1.01, 10.0),
)
def test_dual_clip_bounds_negative_advantage_loss(
    log_ratio: list[float], adv: list[float], clip: float, clip_c: float
) -> None:
    n = len(log_ratio)
    a = torch.tensor(adv[:n], dtype=torch.float64)
    ratio = torch.tensor(log_ratio, dtype=torch.float64).clamp(-20, 20).exp()
    loss, _, dual = ppo_token_losses(ratio, a, clip, clip, clip_c, use_dual_clip=True)
    neg = a < 0
    assert torch.isfinite(loss).all()
    assert (loss[neg] <= clip_c * a[neg].abs() * (1 + 1e-12)).all()
    assert not dual[~neg].any()
    # off the dual clip, the loss is the standard PPO clipped loss
    plain, _, _ = ppo_token_losses(ratio, a, clip, clip, clip_c, use_dual_clip=False)
    assert torch.equal(loss[~dual], plain[~dual])


def test_value_loss_by_hand() -> None:
    vpreds, old, returns = T([[1.0, 2.0, 9.0]]), T([[0.0, 1.8, 0.0]]), T([[1.0, 0.0, 0.0]])
    mask = T([[1.0, 1.0, 0.0]])
    # tok0: clip(1.0, -0.5, 0.5) = 0.5; (1 - 1)^2 = 0 vs (0.5 - 1)^2 = 0.25 -> 0.25, clipped
    # tok1: clip(2.0, 1.3, 2.3) = 2.0; 4 vs 4 -> 4, not clipped.  0.5 * (0.25 + 4) / 2 = 1.0625
    vf_loss, vf_clipfrac = compute_value_loss(vpreds, old, returns, mask, cliprange_value=0.5)
    assert math.isclose(vf_loss.item(), 1.0625, rel_tol=1e-6)
    assert vf_clipfrac.item() == 0.5
    # seq-mean-token-sum: 0.5 * (0.25 + 4) = 2.125
    vf_sum, _ = compute_value_loss(vpreds, old, returns, mask, loss_agg_mode="seq-mean-token-sum")
    assert math.isclose(vf_sum.item(), 2.125, rel_tol=1e-6)


def test_entropy_by_hand_and_against_torch() -> None:
    # uniform over 4 -> ln 4; a banned (-inf) token is simply absent -> ln 2
    logits = T([[0.0, 0.0, 0.0, 0.0], [5.0, 5.0, float("-inf"), float("-inf")]], requires_grad=True)
    out = entropy_from_logits(logits)
    torch.testing.assert_close(out.detach(), T([math.log(4.0), math.log(2.0)]))
    out.sum().backward()
    assert torch.isfinite(logits.grad).all()  # no 0 * inf = NaN from the banned tokens
    x = torch.randn(3, 5, 17, generator=torch.Generator().manual_seed(0)) * 10
    expected = torch.distributions.Categorical(logits=x).entropy()
    # two ways to the entropy: logsumexp - sum p x here, -sum p log p in torch, each made of sums of V = 17 terms at
    # the logits' scale (|x| ~ 30): 2 V x eps32 x max|x|, 1.2e-4, for entropies of ~1
    torch.testing.assert_close(entropy_from_logits(x, chunk_size=4), expected, rtol=0,
                               atol=float32_tol(x, 2 * x.shape[-1]))
    assert entropy_from_logits(x.to(torch.bfloat16)).dtype == torch.float32


def test_logprobs_from_logits() -> None:
    g = torch.Generator().manual_seed(1)
    x = torch.randn(2, 3, 11, generator=g) * 5
    labels = torch.randint(0, 11, (2, 3), generator=g)
    expected = torch.log_softmax(x, -1).gather(-1, labels[..., None]).squeeze(-1)
    # x[label] - logsumexp here, log_softmax's (x - max) - log(sum) in torch: the V-term sum's rounding at the
    # log-probs' scale
    tol = {"rtol": 0, "atol": float32_tol(expected, x.shape[-1])}
    torch.testing.assert_close(logprobs_from_logits(x, labels, chunk_size=4), expected, **tol)
    # bf16 input: computed in float32 from the bf16 values
    xb = x.to(torch.bfloat16)
    expected_b = torch.log_softmax(xb.float(), -1).gather(-1, labels[..., None]).squeeze(-1)
    torch.testing.assert_close(logprobs_from_logits(xb, labels), expected_b, rtol=0,
                               atol=float32_tol(expected_b, x.shape[-1]))
    # gradients flow through the chunks
    xg = x.clone().requires_grad_(True)
    logprobs_from_logits(xg, labels, chunk_size=2).sum().backward()
    assert xg.grad is not None and torch.isfinite(xg.grad).all()
    with pytest.raises(ValueError, match="labels shape"):
        logprobs_from_logits(x, labels[:, :2])
