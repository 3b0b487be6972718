"""Advantage estimators keyed by verl's ``algorithm.adv_estimator`` names.

Every estimator takes ``(token_level_rewards [B, T], response_mask [B, T])`` plus the same
keyword arguments, so a registry can call any of them, and returns ``(advantages, returns)``,
both ``[B, T]`` and 0 where the mask is 0. Results carry no gradient (computed under no_grad).

Masked positions inside a response (e.g. tool/observation tokens between turns) are skipped by
the recursive estimators: they do not reset or discount the running quantity, as verl's GAE.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any, Literal

import numpy as np
import torch

from klguard.algo.stats import masked_sum, masked_whiten

AdvantageFn = Callable[..., tuple[torch.Tensor, torch.Tensor]]
# Group keys per sequence (e.g. prompt uids); anything with .tolist() or iterable works.
GroupIndex = Sequence[Any] | torch.Tensor | np.ndarray


def _check_inputs(rewards: torch.Tensor, mask: torch.Tensor, values: torch.Tensor | None = None) -> None:
    if rewards.dim() != 2:
        raise ValueError(f"token_level_rewards must be [B, T], got shape {tuple(rewards.shape)}")
    if mask.shape != rewards.shape:
        raise ValueError(f"response_mask shape {tuple(mask.shape)} != rewards shape {tuple(rewards.shape)}")
    if values is not None and values.shape != rewards.shape:
        raise ValueError(f"values shape {tuple(values.shape)} != rewards shape {tuple(rewards.shape)}")


def _check_unit(name: str, x: float) -> None:
    if not (math.isfinite(x) and 0.0 <= x <= 1.0):
        raise ValueError(f"{name} must be in [0, 1], got {x!r}")


def _zero(x: torch.Tensor) -> torch.Tensor:
    return torch.zeros((), dtype=x.dtype, device=x.device)


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
    _check_inputs(token_level_rewards, response_mask, values)
    _check_unit("gamma", gamma)
    _check_unit("lam", lam)
    with torch.no_grad():
        valid = response_mask != 0
        rewards = torch.where(valid, token_level_rewards, _zero(token_level_rewards))
        vals = torch.where(valid, values, _zero(values)).to(rewards.dtype)
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
        returns = torch.where(valid, adv + vals, _zero(adv))
        adv = masked_whiten(adv, valid) if whiten else torch.where(valid, adv, _zero(adv))
    return adv, returns


def _group_ids(group_index: GroupIndex | None, batch_size: int, estimator: str) -> torch.Tensor:
    """Map arbitrary hashable group keys (uids, ints) to dense ids 0..G-1."""
    if group_index is None:
        raise ValueError(f"adv_estimator {estimator!r} needs group_index (one group key per sequence)")
    keys = group_index.tolist() if hasattr(group_index, "tolist") else list(group_index)
    if len(keys) != batch_size:
        raise ValueError(f"group_index has {len(keys)} entries, batch has {batch_size} sequences")
    dense: dict[Any, int] = {}
    return torch.tensor([dense.setdefault(k, len(dense)) for k in keys], dtype=torch.long)


def _group_stats(scores: torch.Tensor, ids: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """Per-sequence (group count, group sum, group mean, unbiased group std), gathered by id."""
    ids = ids.to(scores.device)
    n_groups = int(ids.max()) + 1 if ids.numel() else 0
    count = torch.zeros(n_groups, dtype=scores.dtype, device=scores.device).index_add_(0, ids, torch.ones_like(scores))
    total = torch.zeros_like(count).index_add_(0, ids, scores)
    mean = total / count
    sq = torch.zeros_like(count).index_add_(0, ids, (scores - mean[ids]) ** 2)
    std = (sq / (count - 1).clamp(min=1)).sqrt()
    return count[ids], total[ids], mean[ids], std[ids]


def _outcome_scores(rewards: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    return masked_sum(rewards, mask, dim=-1)


def _broadcast(per_seq: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    return torch.where(mask != 0, per_seq.unsqueeze(-1), _zero(per_seq))


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
) -> tuple[torch.Tensor, torch.Tensor]:
    """``grpo``: (score - group mean) / (group std + eps); a group of one has mean 0, std 1.

    ``norm_adv_by_std_in_grpo=False`` drops the std division (Dr. GRPO). Returns = advantages.
    """
    _check_inputs(token_level_rewards, response_mask)
    with torch.no_grad():
        scores = _outcome_scores(token_level_rewards, response_mask)
        ids = _group_ids(group_index, scores.shape[0], "grpo")
        count, _, mean, std = _group_stats(scores, ids)
        single = count < 2
        mean = torch.where(single, _zero(mean), mean)
        std = torch.where(single, torch.ones_like(std), std)
        adv = scores - mean
        if norm_adv_by_std_in_grpo:
            adv = adv / (std + eps)
        adv = _broadcast(adv, response_mask)
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
) -> tuple[torch.Tensor, torch.Tensor]:
    """``rloo``: score minus the mean score of the other group members (Ahmadian et al. 2024).

    A group of one has no other member; its advantage is its raw score (verl's ``rloo``).
    Returns = advantages.
    """
    _check_inputs(token_level_rewards, response_mask)
    with torch.no_grad():
        scores = _outcome_scores(token_level_rewards, response_mask)
        ids = _group_ids(group_index, scores.shape[0], "rloo")
        count, total, _, _ = _group_stats(scores, ids)
        others_mean = (total - scores) / (count - 1).clamp(min=1)
        adv = torch.where(count > 1, scores - others_mean, scores)
        adv = _broadcast(adv, response_mask)
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
) -> tuple[torch.Tensor, torch.Tensor]:
    """``reinforce_plus_plus``: discounted return-to-go, whitened over the batch's valid tokens.

    Returns = the (unwhitened) return-to-go.
    """
    _check_inputs(token_level_rewards, response_mask)
    _check_unit("gamma", gamma)
    with torch.no_grad():
        valid = response_mask != 0
        rewards = torch.where(valid, token_level_rewards, _zero(token_level_rewards))
        running = torch.zeros_like(rewards[:, 0])
        returns = torch.zeros_like(rewards)
        for t in reversed(range(rewards.shape[1])):
            m = valid[:, t]
            running = torch.where(m, rewards[:, t] + gamma * running, running)
            returns[:, t] = torch.where(m, running, _zero(running))
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
) -> tuple[torch.Tensor, torch.Tensor]:
    """``reinforce_plus_plus_baseline``: score minus group mean (0 for a group of one),
    broadcast to tokens, then whitened over the batch's valid tokens. Returns = advantages.
    """
    _check_inputs(token_level_rewards, response_mask)
    with torch.no_grad():
        scores = _outcome_scores(token_level_rewards, response_mask)
        ids = _group_ids(group_index, scores.shape[0], "reinforce_plus_plus_baseline")
        count, _, mean, _ = _group_stats(scores, ids)
        adv = scores - torch.where(count > 1, mean, _zero(mean))
        adv = masked_whiten(_broadcast(adv, response_mask), response_mask)
    return adv, adv


AdvEstimator = Literal["gae", "grpo", "rloo", "reinforce_plus_plus", "reinforce_plus_plus_baseline"]  # the keys below
ADV_ESTIMATORS: dict[str, AdvantageFn] = {
    "gae": gae_advantage,
    "grpo": grpo_advantage,
    "rloo": rloo_advantage,
    "reinforce_plus_plus": reinforce_plus_plus_advantage,
    "reinforce_plus_plus_baseline": reinforce_plus_plus_baseline_advantage,
}
GROUP_ESTIMATORS: frozenset[str] = frozenset({"grpo", "rloo", "reinforce_plus_plus_baseline"})
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
