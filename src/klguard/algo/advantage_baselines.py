"""Outcome estimators with other baselines, as verl 0.9.1 computes them (`verl/trainer/ppo/core_algos.py`).

- ``remax``: return-to-go minus the score of a greedy response to the same prompt (Li et al. 2023).
- ``gpg``: score minus the group mean, scaled by batch size / responses with a nonzero score (Chu et al. 2025).
- ``optimal_token_baseline``: return-to-go minus a per-token baseline, the group's returns weighted by each
  path's accumulated variance proxy ``sum_j 1 - 2 pi_j + sum_v pi_v^2``.
- ``gdpo``: each reward component normalised within its group as GRPO does, summed with weights, then
  whitened over the batch (GDPO, Liu et al. 2026).

Same contract as klguard.algo.advantage: ``(token_level_rewards [B, T], response_mask [B, T])`` plus keyword
arguments; returns ``(advantages, returns)``, 0 where the mask is 0, computed under no_grad. Each is registered with
the inputs it needs (klguard.algo.advantage_registry), which the trainer builds.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from klguard.algo.advantage_registry import register_adv_est
from klguard.algo.advantage_shared import (
    GroupIndex,
    broadcast,
    check_inputs,
    group_ids,
    group_stats,
    outcome_scores,
    zero,
)
from klguard.algo.stats import masked_whiten


def _returns_to_go(rewards: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """sum_{s >= t} r_s over the valid tokens (gamma 1), as verl's remax and OTB."""
    masked = torch.where(mask != 0, rewards, zero(rewards))
    return masked.flip(dims=[-1]).cumsum(dim=-1).flip(dims=[-1])


@register_adv_est("remax", inputs=("reward_baselines",))
def remax_advantage(
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    *,
    reward_baselines: torch.Tensor | None = None,
    **_: Any,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``remax``: return-to-go minus ``reward_baselines`` [B], the score of the greedy response to each row's prompt.
    Returns = the return-to-go."""
    check_inputs(token_level_rewards, response_mask)
    if reward_baselines is None or reward_baselines.shape != token_level_rewards.shape[:1]:
        raise ValueError("adv_estimator 'remax' needs reward_baselines: one greedy response's score per sequence")
    with torch.no_grad():
        returns = _returns_to_go(token_level_rewards, response_mask)
        adv = returns - reward_baselines.to(returns.dtype).unsqueeze(-1)
        valid = response_mask != 0
        adv, returns = torch.where(valid, adv, zero(adv)), torch.where(valid, returns, zero(returns))
    return adv, returns


@register_adv_est("gpg", inputs=("group_index",))
def gpg_advantage(
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    *,
    group_index: GroupIndex | None = None,
    f_norm: float = 1.0,
    **_: Any,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``gpg``: alpha * (score - group mean) / f_norm, alpha = batch size / number of nonzero scores (at least 1);
    a group of one has mean 0 (its advantage is alpha * score). No std division. Returns = advantages."""
    check_inputs(token_level_rewards, response_mask)
    with torch.no_grad():
        scores = token_level_rewards.sum(dim=-1)  # verl sums every position (masked ones hold 0 reward)
        ids = group_ids(group_index, scores.shape[0], "gpg")
        count, _, mean, _ = group_stats(scores, ids)
        alpha = scores.shape[0] / torch.count_nonzero(scores).clamp(min=1).to(scores.dtype)
        adv = alpha * (scores - torch.where(count > 1, mean, zero(mean))) / f_norm
        adv = broadcast(adv, response_mask)
    return adv, adv


@register_adv_est("optimal_token_baseline", inputs=("group_index", "old_log_probs", "sum_pi_squared"))
def optimal_token_baseline_advantage(
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    *,
    group_index: GroupIndex | None = None,
    old_log_probs: torch.Tensor | None = None,
    sum_pi_squared: torch.Tensor | None = None,
    handle_zero_tail: bool = True,
    otb_eps: float = 1e-8,
    **_: Any,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``optimal_token_baseline``: G_t - B_t, B_t = sum_i G_t W_t / sum_i W_t over the group's paths, W_t the
    cumulative sum of ``1 - 2 exp(old_log_prob) + sum_pi_squared`` along a path. A group of one has no baseline.
    ``handle_zero_tail``: where one path is the group's single longest, its baseline past the second-longest
    path's length is 0. Returns = the return-to-go."""
    check_inputs(token_level_rewards, response_mask)
    ids = group_ids(group_index, token_level_rewards.shape[0], "optimal_token_baseline").to(token_level_rewards.device)
    for name, x in (("old_log_probs", old_log_probs), ("sum_pi_squared", sum_pi_squared)):
        if x is None or x.shape != token_level_rewards.shape:
            raise ValueError(f"adv_estimator 'optimal_token_baseline' needs {name} [B, T]")
    with torch.no_grad():
        mask = (response_mask != 0).to(token_level_rewards.dtype)
        returns = _returns_to_go(token_level_rewards, response_mask)
        w = 1 - 2 * old_log_probs.exp() + sum_pi_squared
        w_cum = (torch.where(mask != 0, w, zero(w)) * mask).cumsum(dim=-1)
        baselines = torch.zeros_like(returns)
        for g in range(int(ids.max()) + 1 if ids.numel() else 0):
            rows = (ids == g).nonzero(as_tuple=True)[0]
            if len(rows) < 2:
                continue
            num = (returns[rows] * w_cum[rows] * mask[rows]).sum(dim=0)
            baselines[rows] = num / ((w_cum[rows] * mask[rows]).sum(dim=0) + otb_eps)
            lengths = mask[rows].sum(dim=-1)
            top, second = torch.sort(lengths).values[-2:].tolist()[::-1]
            longest = (lengths == top).nonzero(as_tuple=True)[0]
            if handle_zero_tail and len(longest) == 1 and top > second:
                baselines[rows[longest[0]], int(second):] = 0.0
        adv = (returns - baselines) * mask
    return adv, returns * mask


@register_adv_est("gdpo", inputs=("group_index", "reward_components", "reward_weights"))
def gdpo_advantage(
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    *,
    group_index: GroupIndex | None = None,
    reward_components: Sequence[torch.Tensor] | None = None,
    reward_weights: Sequence[float] | None = None,
    norm_adv_by_std_in_grpo: bool = True,
    eps: float = 1e-6,
    **_: Any,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``gdpo``: sum_k w_k GRPO(component_k), whitened over the batch's valid tokens. ``reward_components``: one [B]
    score per reward key (``algorithm.gdpo_reward_keys``); without them the summed token rewards are the one
    component (then GDPO is GRPO whitened). With components the token rewards, and so a KL penalty in them, are
    not used (as verl). Weights default to 1 each. Returns = advantages."""
    check_inputs(token_level_rewards, response_mask)
    scores = [outcome_scores(token_level_rewards, response_mask)] if not reward_components else \
        [c.to(token_level_rewards.dtype) for c in reward_components]
    weights = list(reward_weights) if reward_weights is not None else [1.0] * len(scores)
    if len(weights) != len(scores):
        raise ValueError(f"gdpo: {len(weights)} reward weights for {len(scores)} reward components")
    with torch.no_grad():
        ids = group_ids(group_index, scores[0].shape[0], "gdpo")
        total = torch.zeros_like(scores[0])
        for weight, comp in zip(weights, scores, strict=True):
            count, _, mean, std = group_stats(comp, ids)
            single = count < 2
            centred = comp - torch.where(single, zero(mean), mean)
            std = torch.where(single, torch.ones_like(std), std)
            total = total + weight * (centred / (std + eps) if norm_adv_by_std_in_grpo else centred)
        adv = masked_whiten(broadcast(total, response_mask), response_mask)
        adv = torch.where(response_mask != 0, adv, zero(adv))
    return adv, adv
