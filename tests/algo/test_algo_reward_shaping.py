"""Token-level rewards and the KL penalty in them, on numbers worked out by hand."""

from __future__ import annotations

import math

import torch

from klguard.algo.reward_shaping import shape_rewards, token_level_scores


def test_score_sits_on_the_last_response_token():
    mask = torch.tensor([[1.0, 1.0, 1.0], [1.0, 0.0, 0.0], [0.0, 0.0, 0.0]])
    scores = token_level_scores(torch.tensor([2.0, -1.0, 5.0]), torch.tensor([3, 1, 0]), mask)
    assert scores.tolist() == [[0.0, 0.0, 2.0], [-1.0, 0.0, 0.0], [5.0, 0.0, 0.0]]  # empty: first column
    assert scores.dtype == mask.dtype


def test_k1_penalty_in_the_reward():
    # d = logprob - ref: row 0 (0.5, -0.25, masked 9), row 1 (0.1, masked, masked)
    logprobs = torch.tensor([[-1.0, -2.0, 7.0], [-0.4, 0.0, 0.0]])
    ref = torch.tensor([[-1.5, -1.75, -2.0], [-0.5, 0.0, 0.0]])
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 0.0, 0.0]])
    scores = token_level_scores(torch.tensor([1.0, 2.0]), torch.tensor([2, 1]), mask)
    out = shape_rewards(scores, logprobs, ref, mask, estimator="kl", beta=0.1, kl_in_reward=True)
    torch.testing.assert_close(out.kl, torch.tensor([[0.5, -0.25, 0.0], [0.1, 0.0, 0.0]]))
    torch.testing.assert_close(out.token_rewards, torch.tensor([[-0.05, 1.025, 0.0], [1.99, 0.0, 0.0]]))
    # token means per sequence: 0.125 and 0.1 -> 0.1125; sums 0.25 and 0.1 -> 0.175
    assert math.isclose(out.kl_token_mean.item(), 0.1125, rel_tol=1e-6)
    assert math.isclose(out.kl_seq_sum.item(), 0.175, rel_tol=1e-6)
    # every response token weighs the same: (0.5 - 0.25 + 0.1) / 3 tokens
    assert math.isclose(out.kl_batch_token_mean.item(), 0.35 / 3, rel_tol=1e-6)


def test_batch_token_mean_sees_a_long_minority_the_mean_of_token_means_cancels():
    # 1 run-on response of 8 tokens with KL 0.5 on its first (skipped EOS) token; 3 short ones at -0.05 per token
    d = torch.zeros(4, 8)
    d[0, 0] = 0.5
    d[1:, :2] = -0.05
    mask = torch.zeros(4, 8)
    mask[0] = 1.0
    mask[1:, :2] = 1.0
    scores = token_level_scores(torch.ones(4), torch.tensor([8, 2, 2, 2]), mask)
    out = shape_rewards(scores, d, torch.zeros(4, 8), mask, estimator="kl", beta=0.0, kl_in_reward=True)
    # sequence token means 0.0625, -0.05, -0.05, -0.05 -> -0.021875; the batch: (0.5 - 0.3) / 14 tokens
    assert math.isclose(out.kl_token_mean.item(), -0.021875, rel_tol=1e-5)
    assert math.isclose(out.kl_batch_token_mean.item(), 0.2 / 14, rel_tol=1e-5)


def test_kl_outside_the_reward_leaves_the_scores():
    logprobs, ref = torch.tensor([[-1.0, -2.0]]), torch.tensor([[-2.0, -2.0]])
    mask = torch.ones(1, 2)
    scores = token_level_scores(torch.tensor([3.0]), torch.tensor([2]), mask)
    out = shape_rewards(scores, logprobs, ref, mask, estimator="low_var_kl", beta=1.0, kl_in_reward=False)
    assert torch.equal(out.token_rewards, scores)
    # k3 of d = 1: exp(-1) + 1 - 1 = 0.3679; of d = 0: 0
    torch.testing.assert_close(out.kl, torch.tensor([[math.exp(-1.0), 0.0]]))
