"""Advantage estimators keyed by verl's ``algorithm.adv_estimator`` names.

Every estimator takes ``(token_level_rewards [B, T], response_mask [B, T])`` plus the same
keyword arguments, so a registry can call any of them, and returns ``(advantages, returns)``,
both ``[B, T]`` and 0 where the mask is 0. Results carry no gradient (computed under no_grad).

Masked positions inside a response (e.g. tool/observation tokens between turns) are skipped by
the recursive estimators: they do not reset or discount the running quantity, as verl's GAE.
The estimators with other baselines (remax, gpg, optimal_token_baseline, gdpo) are in
klguard.algo.advantage_baselines; the registry below holds them all.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Literal

import torch

from klguard.algo.advantage_baselines import (
    gdpo_advantage,
    gpg_advantage,
    optimal_token_baseline_advantage,
    remax_advantage,
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

AdvantageFn = Callable[..., tuple[torch.Tensor, torch.Tensor]]


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


AdvEstimator = Literal["gae", "grpo", "rloo", "reinforce_plus_plus", "reinforce_plus_plus_baseline", "remax", "gpg",
                       "optimal_token_baseline", "gdpo"]  # the keys below
ADV_ESTIMATORS: dict[str, AdvantageFn] = {
    "gae": gae_advantage,
    "grpo": grpo_advantage,
    "rloo": rloo_advantage,
    "reinforce_plus_plus": reinforce_plus_plus_advantage,
    "reinforce_plus_plus_baseline": reinforce_plus_plus_baseline_advantage,
    "remax": remax_advantage,
    "gpg": gpg_advantage,
    "optimal_token_baseline": optimal_token_baseline_advantage,
    "gdpo": gdpo_advantage,
}
# estimators that compare a prompt's responses with each other (a group of one falls back as verl's: see docs/verl.md)
GROUP_ESTIMATORS: frozenset[str] = frozenset({"grpo", "rloo", "reinforce_plus_plus_baseline", "gpg",
                                              "optimal_token_baseline", "gdpo"})
VALUE_ESTIMATORS: frozenset[str] = frozenset({"gae"})


def compute_advantage(
    name: str, token_level_rewards: torch.Tensor, response_mask: torch.Tensor, **kwargs: Any
) -> tuple[torch.Tensor, torch.Tensor]:
    """Dispatch to ``ADV_ESTIMATORS[name]`` with the uniform keyword arguments."""
    fn = ADV_ESTIMATORS.get(name)
    if fn is None:
        raise ValueError(f"unknown adv_estimator {name!r}; valid: {', '.join(ADV_ESTIMATORS)}")
    if name in VALUE_ESTIMATORS and kwargs.get("values") is None:
        raise ValueError(f"adv_estimator {name!r} needs values (a critic)")
    if name in GROUP_ESTIMATORS and kwargs.get("group_index") is None:
        raise ValueError(f"adv_estimator {name!r} needs group_index (one group key per sequence)")
    return fn(token_level_rewards, response_mask, **kwargs)
