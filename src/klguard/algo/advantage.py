"""Advantage estimators keyed by verl's ``algorithm.adv_estimator`` names: GAE and the outcome estimators.

Every estimator takes ``(token_level_rewards [B, T], response_mask [B, T])`` plus keyword arguments, so the
registry (klguard.algo.advantage_registry) can call any of them, and returns ``(advantages, returns)``,
both ``[B, T]`` and 0 where the mask is 0. Results carry no gradient (computed under no_grad).

Masked positions inside a response (e.g. tool/observation tokens between turns) are skipped by
the recursive estimators: they do not reset or discount the running quantity, as verl's GAE.
The estimators with other baselines (remax, gpg, optimal_token_baseline, gdpo) are in
klguard.algo.advantage_baselines, imported at the end for their registrations, so `AdvEstimator` names them all.
"""

from __future__ import annotations

from typing import Any, Literal

import torch

from klguard.algo.advantage_registry import (
    ADV_ESTIMATORS,
    GROUP_ESTIMATORS,
    adv_estimator_names,
    compute_advantage,
    register_adv_est,
)
from klguard.algo.advantage_shared import (
    GroupIndex,
    broadcast,
    check_inputs,
    check_unit,
    group_ids,
    group_stats,
    outcome_scores,
    zero,
)
from klguard.algo.stats import masked_whiten

__all__ = ["ADV_ESTIMATORS", "GROUP_ESTIMATORS", "AdvEstimator", "compute_advantage", "compute_gae"]


def compute_gae(
    token_level_rewards: torch.Tensor,
    values: torch.Tensor,
    response_mask: torch.Tensor,
    gamma: float = 1.0,
    lam: float = 1.0,
    whiten: bool = True,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Generalised advantage estimation (Schulman et al. 2016) over the valid tokens.

    ``returns = raw advantages + values``; ``whiten`` then normalises the advantages over all
    valid tokens of the batch (verl always whitens).
    """
    check_inputs(token_level_rewards, response_mask, values)
    check_unit("gamma", gamma)
    check_unit("lam", lam)
    with torch.no_grad():
        valid = response_mask != 0
        rewards = torch.where(valid, token_level_rewards, zero(token_level_rewards))
        vals = torch.where(valid, values, zero(values)).to(rewards.dtype)
        next_value = torch.zeros_like(rewards[:, 0])
        last_gae = torch.zeros_like(rewards[:, 0])
        adv = torch.zeros_like(rewards)
        for t in reversed(range(rewards.shape[1])):
            m = valid[:, t]
            delta = rewards[:, t] + gamma * next_value - vals[:, t]
            gae_t = delta + gamma * lam * last_gae
            # A masked token is transparent: carry the value and advantage of the next valid one.
            next_value = torch.where(m, vals[:, t], next_value)
            last_gae = torch.where(m, gae_t, last_gae)
            adv[:, t] = last_gae
        returns = torch.where(valid, adv + vals, zero(adv))
        adv = masked_whiten(adv, valid) if whiten else torch.where(valid, adv, zero(adv))
    return adv, returns


@register_adv_est("gae", inputs=("values",))
def gae_advantage(
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    *,
    values: torch.Tensor | None = None,
    group_index: GroupIndex | None = None,
    gamma: float = 1.0,
    lam: float = 1.0,
    norm_adv_by_std_in_grpo: bool = True,
    eps: float = 1e-6,
    **_: Any,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``gae``: whitened GAE advantages, returns = raw advantages + values."""
    if values is None:
        raise ValueError("adv_estimator 'gae' needs values (the critic's per-token value estimates)")
    return compute_gae(token_level_rewards, values, response_mask, gamma, lam, whiten=True)


@register_adv_est("grpo", inputs=("group_index",))
def grpo_advantage(
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    *,
    values: torch.Tensor | None = None,
    group_index: GroupIndex | None = None,
    gamma: float = 1.0,
    lam: float = 1.0,
    norm_adv_by_std_in_grpo: bool = True,
    eps: float = 1e-6,
    **_: Any,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``grpo``: (score - group mean) / (group std + eps); a group of one has mean 0, std 1.

    ``norm_adv_by_std_in_grpo=False`` drops the std division (Dr. GRPO). Returns = advantages.
    """
    check_inputs(token_level_rewards, response_mask)
    with torch.no_grad():
        scores = outcome_scores(token_level_rewards, response_mask)
        ids = group_ids(group_index, scores.shape[0], "grpo")
        count, _, mean, std = group_stats(scores, ids)
        single = count < 2
        mean = torch.where(single, zero(mean), mean)
        std = torch.where(single, torch.ones_like(std), std)
        adv = scores - mean
        if norm_adv_by_std_in_grpo:
            adv = adv / (std + eps)
        adv = broadcast(adv, response_mask)
    return adv, adv


@register_adv_est("rloo", inputs=("group_index",))
def rloo_advantage(
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    *,
    values: torch.Tensor | None = None,
    group_index: GroupIndex | None = None,
    gamma: float = 1.0,
    lam: float = 1.0,
    norm_adv_by_std_in_grpo: bool = True,
    eps: float = 1e-6,
    **_: Any,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``rloo``: score minus the mean score of the other group members (Ahmadian et al. 2024).

    A group of one has no other member; its advantage is its raw score (verl's ``rloo``).
    Returns = advantages.
    """
    check_inputs(token_level_rewards, response_mask)
    with torch.no_grad():
        scores = outcome_scores(token_level_rewards, response_mask)
        ids = group_ids(group_index, scores.shape[0], "rloo")
        count, total, _, _ = group_stats(scores, ids)
        others_mean = (total - scores) / (count - 1).clamp(min=1)
        adv = torch.where(count > 1, scores - others_mean, scores)
        adv = broadcast(adv, response_mask)
    return adv, adv


@register_adv_est("reinforce_plus_plus")
def reinforce_plus_plus_advantage(
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    *,
    values: torch.Tensor | None = None,
    group_index: GroupIndex | None = None,
    gamma: float = 1.0,
    lam: float = 1.0,
    norm_adv_by_std_in_grpo: bool = True,
    eps: float = 1e-6,
    **_: Any,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``reinforce_plus_plus``: discounted return-to-go, whitened over the batch's valid tokens.

    Returns = the (unwhitened) return-to-go.
    """
    check_inputs(token_level_rewards, response_mask)
    check_unit("gamma", gamma)
    with torch.no_grad():
        valid = response_mask != 0
        rewards = torch.where(valid, token_level_rewards, zero(token_level_rewards))
        running = torch.zeros_like(rewards[:, 0])
        returns = torch.zeros_like(rewards)
        for t in reversed(range(rewards.shape[1])):
            m = valid[:, t]
            running = torch.where(m, rewards[:, t] + gamma * running, running)
            returns[:, t] = torch.where(m, running, zero(running))
        adv = masked_whiten(returns, valid)
    return adv, returns


@register_adv_est("reinforce_plus_plus_baseline", inputs=("group_index",))
def reinforce_plus_plus_baseline_advantage(
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    *,
    values: torch.Tensor | None = None,
    group_index: GroupIndex | None = None,
    gamma: float = 1.0,
    lam: float = 1.0,
    norm_adv_by_std_in_grpo: bool = True,
    eps: float = 1e-6,
    **_: Any,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``reinforce_plus_plus_baseline``: score minus group mean (0 for a group of one),
    broadcast to tokens, then whitened over the batch's valid tokens. Returns = advantages.
    """
    check_inputs(token_level_rewards, response_mask)
    with torch.no_grad():
        scores = outcome_scores(token_level_rewards, response_mask)
        ids = group_ids(group_index, scores.shape[0], "reinforce_plus_plus_baseline")
        count, _, mean, _ = group_stats(scores, ids)
        adv = scores - torch.where(count > 1, mean, zero(mean))
        adv = masked_whiten(broadcast(adv, response_mask), response_mask)
    return adv, adv


# verl's estimators with other baselines register after these ones, the order of the config's choices
from klguard.algo import advantage_baselines  # noqa: E402, F401

# the schema's algorithm.adv_estimator takes this type: the registered names, this module's and advantage_baselines'
AdvEstimator = Literal[adv_estimator_names()]
