"""verl 0.9.1's estimators remax, gpg, optimal_token_baseline and gdpo: each on a small batch worked out by hand in
the comments (float64), then against verl's own function on a random batch where verl is installed."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from extras import import_extra
from klguard.algo.advantage import compute_advantage

MASK = torch.tensor([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0], [1.0, 0.0, 0.0]], dtype=torch.float64)


def T(rows: list) -> torch.Tensor:
    return torch.tensor(rows, dtype=torch.float64)


def outcome(scores: list[float], mask: torch.Tensor = MASK) -> torch.Tensor:
    """Each score on its row's last valid token, garbage on the padding (which must not count)."""
    r = torch.where(mask == 0, torch.full_like(mask, 9.0), torch.zeros_like(mask))
    last = mask.sum(dim=1).long() - 1
    r[torch.arange(len(scores)), last] = T(scores)
    return r


def test_remax_subtracts_the_greedy_score_from_the_return_to_go():
    rewards = T([[0.5, 0.0, 1.0], [0.0, 2.0, 9.0], [3.0, 9.0, 9.0]])
    adv, ret = compute_advantage("remax", rewards, MASK, reward_baselines=T([1.0, 0.5, 4.0]))
    # returns-to-go: [1.5, 1, 1] | [2, 2, -] | [3, -, -]; minus the baselines 1, 0.5, 4
    torch.testing.assert_close(ret * MASK, T([[1.5, 1.0, 1.0], [2.0, 2.0, 0.0], [3.0, 0.0, 0.0]]))
    torch.testing.assert_close(adv, T([[0.5, 0.0, 0.0], [1.5, 1.5, 0.0], [-1.0, 0.0, 0.0]]))


def test_remax_without_baselines_says_so():
    with pytest.raises(ValueError, match="reward_baselines"):
        compute_advantage("remax", outcome([1.0, 0.0, 0.0]), MASK)


def test_gpg_centres_by_group_and_scales_by_the_share_of_nonzero_scores():
    # groups {0, 1} and {2}; scores 1, 0, 2 -> 2 nonzero of 3: alpha = 1.5
    # group {0,1}: mean 0.5 -> 1.5 * 0.5 = 0.75, 1.5 * -0.5 = -0.75; group of one: mean 0 -> 1.5 * 2 = 3
    ones = torch.ones(3, 3, dtype=torch.float64)
    adv, ret = compute_advantage("gpg", outcome([1.0, 0.0, 2.0], ones), ones, group_index=[0, 0, 1])
    torch.testing.assert_close(adv[:, 0], T([0.75, -0.75, 3.0]))
    torch.testing.assert_close(adv, ret)


def test_gpg_with_every_score_zero_gives_zero():
    adv, _ = compute_advantage("gpg", torch.zeros(3, 3, dtype=torch.float64), MASK, group_index=[0, 0, 0])
    assert torch.count_nonzero(adv) == 0


def test_optimal_token_baseline_weights_returns_by_accumulated_path_variance():
    # one group of two paths of length 2 (no tail to zero); rewards at the end: 1 and 0
    mask = torch.ones(2, 2, dtype=torch.float64)
    rewards = T([[0.0, 1.0], [0.0, 0.0]])
    # pi = 0.5 everywhere and sum pi^2 = 0.5: w = 1 - 1 + 0.5 = 0.5 -> W = [0.5, 1.0] on both paths
    logp = torch.full((2, 2), np.log(0.5), dtype=torch.float64)
    spp = torch.full((2, 2), 0.5, dtype=torch.float64)
    adv, ret = compute_advantage("optimal_token_baseline", rewards, mask, group_index=[7, 7], old_log_probs=logp,
                                 sum_pi_squared=spp)
    # G = [[1, 1], [0, 0]]; equal W -> B_t = mean G_t = 0.5 (up to the 1e-8 in the denominator)
    torch.testing.assert_close(ret, T([[1.0, 1.0], [0.0, 0.0]]))
    torch.testing.assert_close(adv, T([[0.5, 0.5], [-0.5, -0.5]]), rtol=0, atol=1e-7)


def test_optimal_token_baseline_zeroes_the_tail_of_the_single_longest_path():
    mask = T([[1.0, 1.0, 1.0], [1.0, 0.0, 0.0]])
    rewards = T([[0.0, 0.0, 2.0], [1.0, 0.0, 0.0]])
    logp = torch.full((2, 3), np.log(0.5), dtype=torch.float64)
    spp = T([[0.5, 0.5, 0.5], [1.5, 0.5, 0.5]])  # w: row 0 0.5 each, row 1 1.5 -> W0 = [.5, 1, 1.5], W1 = [1.5]
    adv, _ = compute_advantage("optimal_token_baseline", rewards, mask, group_index=[0, 0], old_log_probs=logp,
                               sum_pi_squared=spp)
    # t=0: G = 2 and 1, B = (2 * .5 + 1 * 1.5) / 2 = 1.25; row 0 past length 1 (the other path's): baseline 0
    torch.testing.assert_close(adv, T([[0.75, 2.0, 2.0], [-0.25, 0.0, 0.0]]), rtol=0, atol=1e-7)


def test_gdpo_normalises_each_component_in_its_group_then_whitens():
    mask = torch.ones(4, 2, dtype=torch.float64)
    fmt, acc = T([1.0, 0.0, 1.0, 1.0]), T([1.0, 1.0, 0.0, 1.0])  # two groups of two
    adv, ret = compute_advantage("gdpo", torch.zeros(4, 2, dtype=torch.float64), mask, group_index=[0, 0, 1, 1],
                                 reward_components=[fmt, acc], reward_weights=[1.0, 2.0], eps=1e-12)
    # fmt: group 0 (1, 0) -> +-0.5 / std, std = sqrt(0.5) -> +-0.7071; group 1 (1, 1) -> 0, 0
    # acc: group 0 -> 0, 0; group 1 (0, 1) -> -+0.7071, weighted 2 -> -1.4142, 1.4142
    total = T([1.0, -1.0, -2.0, 2.0]) / 2**0.5
    # whitened over 8 tokens (each row twice): mean 0, unbiased var = 2 * (0.5 + 0.5 + 2 + 2) / 7
    whitened = total / (10 / 7) ** 0.5
    torch.testing.assert_close(adv[:, 0], whitened, rtol=0, atol=1e-7)
    torch.testing.assert_close(adv, ret)


def test_gdpo_without_components_is_grpo_whitened():
    scores = T([1.0, 0.0, 3.0, 1.0])
    mask = torch.ones(4, 2, dtype=torch.float64)
    gdpo, _ = compute_advantage("gdpo", outcome(scores.tolist(), mask), mask, group_index=[0, 0, 1, 1])
    grpo, _ = compute_advantage("grpo", outcome(scores.tolist(), mask), mask, group_index=[0, 0, 1, 1])
    whitened = (grpo - grpo.mean()) / grpo.std()
    torch.testing.assert_close(gdpo, whitened, rtol=0, atol=1e-6)


# ---------------------------------------------------------------- against verl's own functions
@pytest.fixture(scope="module")
def core_algos():
    return import_extra("verl.trainer.ppo.core_algos", "verl")


def _random_batch(b: int = 8, t: int = 6):
    g = torch.Generator().manual_seed(0)
    lengths = torch.tensor([6, 4, 5, 2, 6, 3, 1, 6])[:b]
    mask = (torch.arange(t) < lengths.unsqueeze(1)).to(torch.float32)
    rewards = torch.randn(b, t, generator=g) * mask
    rewards[1] = 0.0  # a zero score for gpg's count of nonzero scores
    index = np.array(["a", "a", "a", "b", "b", "c", "d", "d"], dtype=object)[:b]  # a group of one: c
    logp = (torch.rand(b, t, generator=g) * 0.9 + 0.05).log()
    spp = torch.rand(b, t, generator=g) * 0.5 + logp.exp() ** 2
    return rewards, mask, index, logp, spp


def _close(ours: torch.Tensor, theirs: torch.Tensor, mask: torch.Tensor) -> None:
    scale = float(theirs.abs().max()) if theirs.numel() else 1.0
    torch.testing.assert_close(ours * mask, theirs * mask, rtol=0, atol=64 * torch.finfo(torch.float32).eps * scale)


def test_remax_matches_verl(core_algos):
    rewards, mask, _, _, _ = _random_batch()
    baselines = torch.randn(8, generator=torch.Generator().manual_seed(3))
    theirs = core_algos.compute_remax_outcome_advantage(rewards, baselines, mask)
    ours = compute_advantage("remax", rewards, mask, reward_baselines=baselines)
    for a, b in zip(ours, theirs, strict=True):
        _close(a, b, mask)


def test_gpg_matches_verl(core_algos):
    rewards, mask, index, _, _ = _random_batch()
    theirs = core_algos.compute_gpg_outcome_advantage(rewards.clone(), mask, index)
    ours = compute_advantage("gpg", rewards, mask, group_index=index)
    for a, b in zip(ours, theirs, strict=True):
        _close(a, b, mask)


@pytest.mark.parametrize("zero_tail", [True, False])
def test_optimal_token_baseline_matches_verl(core_algos, zero_tail: bool):
    rewards, mask, index, logp, spp = _random_batch()
    theirs = core_algos.compute_optimal_token_baseline_advantage(rewards, mask, index, logp, spp,
                                                                handle_zero_tail=zero_tail)
    ours = compute_advantage("optimal_token_baseline", rewards, mask, group_index=index, old_log_probs=logp,
                             sum_pi_squared=spp, handle_zero_tail=zero_tail)
    for a, b in zip(ours, theirs, strict=True):
        _close(a, b, mask)


@pytest.mark.parametrize("norm", [True, False])
def test_gdpo_matches_verl(core_algos, norm: bool):
    from omegaconf import OmegaConf

    rewards, mask, index, _, _ = _random_batch()
    g = torch.Generator().manual_seed(5)
    comps = {"fmt": (torch.rand(8, generator=g) > 0.5).float(), "acc": torch.randn(8, generator=g)}
    prompts = torch.zeros(8, 3)
    attention = torch.cat([torch.ones(8, 3), mask], dim=1).long()
    config = OmegaConf.create({"gdpo_reward_keys": ["fmt", "acc"], "gdpo_reward_weights": [0.5, 2.0]})
    theirs = core_algos.compute_gdpo_outcome_advantage(
        rewards, mask, index, norm_adv_by_std_in_grpo=norm, config=config,
        non_tensor_batch={k: v.numpy() for k, v in comps.items()},
        batch={"prompts": prompts, "attention_mask": attention})
    ours = compute_advantage("gdpo", rewards, mask, group_index=index, reward_components=list(comps.values()),
                             reward_weights=[0.5, 2.0], norm_adv_by_std_in_grpo=norm)
    for a, b in zip(ours, theirs, strict=True):
        _close(a, b, mask)
