"""Token-level rewards: the sequence score on the last response token, minus beta times the per-token KL.

With ``use_kl_in_reward`` (verl's ``algorithm.use_kl_in_reward``) the reward of response token t is
``score * [t is last] - beta * KL_t``, where ``KL_t`` is a per-token estimate of KL(pi || pi_ref) at the sampled
token (``klguard.algo.kl.kl_penalty``). The KL statistics the controller and the metrics read come out with it:
the mean over sequences of each sequence's mean token KL (verl's ``actor/reward_kl_penalty``), the mean
per-sequence KL sum (what TRL's controller sees) and the KL per token of the whole batch (every sampled token weighs
the same, so the KL of a few long responses is not averaged away by the short ones).
"""

from __future__ import annotations

from typing import NamedTuple

import torch
from torch import Tensor

from klguard.algo.kl import kl_penalty
from klguard.algo.stats import masked_mean


def token_level_scores(scores: Tensor, response_lengths: Tensor, response_mask: Tensor) -> Tensor:
    """``[B, R]`` zeros with each sequence's score ``[B]`` on its last response token (the first column of an
    empty response), in the dtype of ``response_mask``."""
    token_scores = torch.zeros_like(response_mask)
    last = (response_lengths - 1).clamp(min=0)
    token_scores[torch.arange(len(scores)), last] = scores.to(response_mask)
    return token_scores


class ShapedRewards(NamedTuple):
    token_rewards: Tensor  # [B, R]: the token scores, minus beta * kl when the KL is in the reward
    kl: Tensor  # [B, R]: per-token KL estimate, 0 outside the response mask
    kl_token_mean: Tensor  # scalar: mean over sequences of the mean token KL of each
    kl_seq_sum: Tensor  # scalar: mean over sequences of the summed token KL of each
    kl_batch_token_mean: Tensor  # scalar: the batch's summed token KL over its number of response tokens


def shape_rewards(token_scores: Tensor, logprobs: Tensor, ref_logprobs: Tensor, response_mask: Tensor, *,
                  estimator: str, beta: float, kl_in_reward: bool) -> ShapedRewards:
    """The KL penalty of sampled tokens (log-probs ``[B, R]`` under the policy that sampled them and under the
    reference) and the token rewards it shapes; ``kl_in_reward=False`` leaves the rewards as the scores."""
    kl = kl_penalty(logprobs, ref_logprobs, estimator) * response_mask
    token_mean = masked_mean(kl, response_mask, dim=-1).mean()
    seq_sum = kl.sum(-1).mean()
    batch_token_mean = kl.sum() / response_mask.sum().clamp(min=1)
    rewards = token_scores - beta * kl if kl_in_reward else token_scores
    return ShapedRewards(rewards, kl, token_mean, seq_sum, batch_token_mean)


def overlong_penalty(response_lengths: Tensor, max_resp_len: int, buffer_len: int, penalty_factor: float) -> Tensor:
    """DAPO's overlong shaping (verl's DAPO reward manager): ``min(-(length - (max_resp_len - buffer_len)) /
    buffer_len * penalty_factor, 0)`` per response ``[B]``; 0 up to ``max_resp_len - buffer_len`` tokens, then
    falling linearly to ``-penalty_factor`` at ``max_resp_len``."""
    if buffer_len <= 0:
        raise ValueError(f"overlong buffer length must be > 0, got {buffer_len}")
    exceed = response_lengths.to(torch.float64) - (max_resp_len - buffer_len)
    return (-exceed / buffer_len * penalty_factor).clamp(max=0.0).to(torch.float32)


def informative_groups(values: Tensor, group_index: Tensor) -> Tensor:
    """DAPO's dynamic-sampling filter: ``[G]`` True for each group (ids 0..G-1 in ``group_index [B]``) whose
    ``values [B]`` are not all equal, or that has one member (verl drops a group of two or more whose metric's std
    is 0: every response scored alike, so a group-relative advantage is 0 for all)."""
    groups = int(group_index.max()) + 1 if group_index.numel() else 0
    keep = torch.zeros(groups, dtype=torch.bool)
    for g in range(groups):
        members = values[group_index == g]
        keep[g] = len(members) == 1 or bool((members != members[0]).any())
    return keep
