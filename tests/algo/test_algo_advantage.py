"""Advantage estimators: hand cases, a plain-loop GAE reference, masking and registry errors."""

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from klguard.algo.advantage import (
    ADV_ESTIMATORS,
    GROUP_ESTIMATORS,
    compute_advantage,
    compute_gae,
)
from klguard.algo.stats import masked_whiten

FAST = settings(max_examples=60, deadline=None)
T = torch.tensor


def test_gae_by_hand_no_discount() -> None:
    r, v, m = T([[0.0, 0.0, 1.0]]), T([[0.5, 0.25, 0.5]]), torch.ones(1, 3)
    # deltas (gamma=1): t2: 1 + 0 - 0.5 = 0.5; t1: 0 + 0.5 - 0.25 = 0.25; t0: 0 + 0.25 - 0.5 = -0.25
    # A (lam=1): A2 = 0.5; A1 = 0.25 + 0.5 = 0.75; A0 = -0.25 + 0.75 = 0.5; returns = A + V = 1
    adv, ret = compute_gae(r, v, m, gamma=1.0, lam=1.0, whiten=False)
    torch.testing.assert_close(adv, T([[0.5, 0.75, 0.5]]))
    torch.testing.assert_close(ret, T([[1.0, 1.0, 1.0]]))


def test_gae_by_hand_discounted() -> None:
    r, v, m = T([[0.0, 0.0, 1.0]]), T([[0.5, 0.25, 0.5]]), torch.ones(1, 3)
    # gamma 0.9, lam 0.5 (gamma*lam = 0.45)
    # deltas: t2: 1 - 0.5 = 0.5; t1: 0.9*0.5 - 0.25 = 0.2; t0: 0.9*0.25 - 0.5 = -0.275
    # A2 = 0.5; A1 = 0.2 + 0.45*0.5 = 0.425; A0 = -0.275 + 0.45*0.425 = -0.08375
    adv, ret = compute_gae(r, v, m, gamma=0.9, lam=0.5, whiten=False)
    torch.testing.assert_close(adv, T([[-0.08375, 0.425, 0.5]]))
    torch.testing.assert_close(ret, T([[0.41625, 0.675, 1.0]]))


def test_gae_skips_holes_and_padding() -> None:
    # token 1 is a masked hole (its reward 9 and value 7 are ignored), token 3 is padding
    r, v = T([[0.0, 9.0, 1.0, 4.0]]), T([[0.5, 7.0, 0.5, 3.0]])
    m = T([[1.0, 0.0, 1.0, 0.0]])
    # t2: delta = 1 + 0 - 0.5 = 0.5 = A2; the hole passes next value 0.5 and A 0.5 through;
    # t0: delta = 0 + 0.5 - 0.5 = 0 -> A0 = 0 + 0.5 = 0.5. Returns A + V = 1 at valid tokens.
    adv, ret = compute_gae(r, v, m, gamma=1.0, lam=1.0, whiten=False)
    torch.testing.assert_close(adv, T([[0.5, 0.0, 0.5, 0.0]]))
    torch.testing.assert_close(ret, T([[1.0, 0.0, 1.0, 0.0]]))


def _gae_reference(r: list, v: list, m: list, gamma: float, lam: float) -> tuple[list, list]:
    """Plain reverse loop over the valid tokens of one row."""
    adv, ret = [0.0] * len(r), [0.0] * len(r)
    next_value, last = 0.0, 0.0
    for t in reversed(range(len(r))):
        if not m[t]:
            continue
        delta = r[t] + gamma * next_value - v[t]
        last = delta + gamma * lam * last
        next_value = v[t]
        adv[t], ret[t] = last, last + v[t]
    return adv, ret


def _random_batch(seed: int, b: int, t: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    r = torch.randn(b, t, generator=g, dtype=torch.float64)
    v = torch.randn(b, t, generator=g, dtype=torch.float64)
    lengths = torch.randint(0, t + 1, (b,), generator=g)
    m = (torch.arange(t) < lengths[:, None]).double()  # right padding
    m = m * (torch.rand(b, t, generator=g) > 0.2)  # plus holes inside the response
    return r, v, m


@FAST
@given(
    seed=st.integers(0, 2**16),
    b=st.integers(1, 4),
    t=st.integers(1, 12),
    gamma=st.floats(0.0, 1.0),
    lam=st.floats(0.0, 1.0),
)
def test_gae_matches_reference_loop(seed: int, b: int, t: int, gamma: float, lam: float) -> None:
    r, v, m = _random_batch(seed, b, t)
    adv, ret = compute_gae(r, v, m, gamma=gamma, lam=lam, whiten=False)
    for i in range(b):
        ref_adv, ref_ret = _gae_reference(r[i].tolist(), v[i].tolist(), m[i].tolist(), gamma, lam)
        torch.testing.assert_close(adv[i], T(ref_adv, dtype=torch.float64))
        torch.testing.assert_close(ret[i], T(ref_ret, dtype=torch.float64))
    white, _ = compute_advantage("gae", r, m, values=v, gamma=gamma, lam=lam)
    torch.testing.assert_close(white, masked_whiten(adv, m))


# Four sequences, scores (sums of token rewards) 1, 0, 2 in group "a" and 5 alone in group "b".
REWARDS = T([[0.0, 1.0, 0.0], [0.0, 0.0, 0.0], [1.0, 1.0, 0.0], [0.0, 0.0, 5.0]])
MASK = T([[1.0, 1.0, 0.0], [1.0, 0.0, 0.0], [1.0, 1.0, 1.0], [1.0, 1.0, 1.0]])
GROUPS = ["a", "a", "a", "b"]


def _per_seq(adv: torch.Tensor) -> torch.Tensor:
    """The one value each row is broadcast to (checks it really is constant on the mask)."""
    first = adv[:, 0]
    assert torch.allclose(adv, first[:, None] * MASK)
    return first


def test_grpo_by_hand() -> None:
    # group a: mean 1, unbiased std sqrt((0 + 1 + 1) / 2) = 1 -> (s - 1) / (1 + eps) = 0, -1, 1
    # group b alone: mean 0, std 1 -> 5 / (1 + eps)
    adv, ret = compute_advantage("grpo", REWARDS, MASK, group_index=GROUPS)
    torch.testing.assert_close(_per_seq(adv), T([0.0, -1.0, 1.0, 5.0]) / (1 + 1e-6))
    assert torch.equal(adv, ret)
    # Dr. GRPO: no std division
    adv, _ = compute_advantage("grpo", REWARDS, MASK, group_index=GROUPS, norm_adv_by_std_in_grpo=False)
    torch.testing.assert_close(_per_seq(adv), T([0.0, -1.0, 1.0, 5.0]))


def test_grpo_uneven_group_and_index_types() -> None:
    # group {1, 0}: mean 0.5, std sqrt(0.25 + 0.25) = 0.70711 -> +-0.5 / 0.70711 = +-0.70711
    expected = T([0.5, -0.5, 0.0, 0.0]) / (0.5**0.5 + 1e-6)
    expected[2:] = T([2.0, 5.0]) / (1 + 1e-6)  # two singletons
    for index in ([0, 0, 1, 2], np.array([0, 0, 1, 2]), torch.tensor([0, 0, 1, 2])):
        adv, _ = compute_advantage("grpo", REWARDS, MASK, group_index=index)
        torch.testing.assert_close(_per_seq(adv), expected)


def test_grpo_equal_scores_give_zero() -> None:
    # std 0 -> (s - mean) / (0 + eps) = 0 / eps = 0, not NaN
    adv, _ = compute_advantage("grpo", torch.ones(3, 2), torch.ones(3, 2), group_index=[1, 1, 1])
    assert torch.equal(adv, torch.zeros(3, 2))


def test_rloo_by_hand() -> None:
    # group a: 1 - mean(0, 2) = 0; 0 - mean(1, 2) = -1.5; 2 - mean(1, 0) = 1.5
    # group b alone: no other member -> raw score 5 (verl's rloo)
    adv, ret = compute_advantage("rloo", REWARDS, MASK, group_index=GROUPS)
    torch.testing.assert_close(_per_seq(adv), T([0.0, -1.5, 1.5, 5.0]))
    assert torch.equal(adv, ret)


def test_reinforce_plus_plus_by_hand() -> None:
    r = T([[0.0, 0.0, 1.0], [0.0, 2.0, 0.0], [0.0, 3.0, 1.0]])
    m = T([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0], [1.0, 0.0, 1.0]])
    # gamma 0.5. row 0: G2 = 1, G1 = 0.5, G0 = 0.25. row 1 (padded): G1 = 2, G0 = 1.
    # row 2 (hole at 1, its reward 3 ignored, no discount step): G2 = 1, G0 = 0 + 0.5 * 1 = 0.5
    adv, ret = compute_advantage("reinforce_plus_plus", r, m, gamma=0.5)
    expected_ret = T([[0.25, 0.5, 1.0], [1.0, 2.0, 0.0], [0.5, 0.0, 1.0]])
    torch.testing.assert_close(ret, expected_ret)
    torch.testing.assert_close(adv, masked_whiten(expected_ret, m))


def test_reinforce_plus_plus_baseline_by_hand() -> None:
    # group a: s - mean = 0, -1, 1; group b alone: mean 0 -> 5; broadcast, then whitened over
    # the 9 valid tokens: values 0,0 | -1 | 1,1,1 | 5,5,5
    adv, ret = compute_advantage("reinforce_plus_plus_baseline", REWARDS, MASK, group_index=GROUPS)
    centred = T([[0.0, 0.0, 0.0], [-1.0, 0.0, 0.0], [1.0, 1.0, 1.0], [5.0, 5.0, 5.0]]) * MASK
    torch.testing.assert_close(adv, masked_whiten(centred, MASK))
    assert torch.equal(adv, ret)


ALL_KWARGS = {"values": None, "group_index": None, "gamma": 0.9, "lam": 0.8, "eps": 1e-6}


@pytest.mark.parametrize("name", sorted(ADV_ESTIMATORS))
def test_every_estimator_is_zero_off_mask(name: str) -> None:
    r, v, m = _random_batch(3, 5, 7)
    logp = -torch.rand(r.shape, dtype=r.dtype) - 0.05
    kwargs = ALL_KWARGS | {"values": v, "group_index": [0, 0, 1, 1, 2], "norm_adv_by_std_in_grpo": True,
                           "reward_baselines": v[:, 0], "old_log_probs": logp, "sum_pi_squared": logp.exp() ** 2}
    adv, ret = ADV_ESTIMATORS[name](r, m, **kwargs)  # one uniform signature for all
    assert adv.shape == ret.shape == r.shape
    assert torch.isfinite(adv).all() and torch.isfinite(ret).all()
    assert (adv[m == 0] == 0).all() and (ret[m == 0] == 0).all()


def test_registry_names_and_errors() -> None:
    assert set(ADV_ESTIMATORS) == {
        "gae",
        "grpo",
        "rloo",
        "reinforce_plus_plus",
        "reinforce_plus_plus_baseline",
        "remax",
        "gpg",
        "optimal_token_baseline",
        "gdpo",
    }
    assert set(GROUP_ESTIMATORS) == {"grpo", "rloo", "reinforce_plus_plus_baseline", "gpg", "optimal_token_baseline",
                                     "gdpo"}
    with pytest.raises(ValueError, match=r"'ppo'.*grpo"):
        compute_advantage("ppo", REWARDS, MASK)
    with pytest.raises(ValueError, match="values"):
        compute_advantage("gae", REWARDS, MASK)
    for name in GROUP_ESTIMATORS:
        with pytest.raises(ValueError, match="group_index"):
            compute_advantage(name, REWARDS, MASK)
        with pytest.raises(ValueError, match="group_index"):
            ADV_ESTIMATORS[name](REWARDS, MASK)
    with pytest.raises(ValueError, match="3 entries"):
        compute_advantage("grpo", REWARDS, MASK, group_index=[0, 0, 1])
    with pytest.raises(ValueError, match="shape"):
        compute_advantage("rloo", REWARDS, MASK[:, :2], group_index=GROUPS)
    with pytest.raises(ValueError, match="gamma"):
        compute_advantage("reinforce_plus_plus", REWARDS, MASK, gamma=1.5)
