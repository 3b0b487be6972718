"""What the advantage estimators share: input checks, group keys and per-group statistics, outcome scores."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from klguard.algo.stats import masked_sum

# Group keys per sequence (e.g. prompt uids); anything with .tolist() or iterable works.
GroupIndex = Sequence[Any] | torch.Tensor | np.ndarray


def check_inputs(rewards: torch.Tensor, mask: torch.Tensor, values: torch.Tensor | None = None) -> None:
    if rewards.dim() != 2:
        raise ValueError(f"token_level_rewards must be [B, T], got shape {tuple(rewards.shape)}")
    if mask.shape != rewards.shape:
        raise ValueError(f"response_mask shape {tuple(mask.shape)} != rewards shape {tuple(rewards.shape)}")
    if values is not None and values.shape != rewards.shape:
        raise ValueError(f"values shape {tuple(values.shape)} != rewards shape {tuple(rewards.shape)}")


def check_unit(name: str, x: float) -> None:
    if not (math.isfinite(x) and 0.0 <= x <= 1.0):
        raise ValueError(f"{name} must be in [0, 1], got {x!r}")


def zero(x: torch.Tensor) -> torch.Tensor:
    return torch.zeros((), dtype=x.dtype, device=x.device)


def group_ids(group_index: GroupIndex | None, batch_size: int, estimator: str) -> torch.Tensor:
    """Map arbitrary hashable group keys (uids, ints) to dense ids 0..G-1."""
    if group_index is None:
        raise ValueError(f"adv_estimator {estimator!r} needs group_index (one group key per sequence)")
    keys = group_index.tolist() if hasattr(group_index, "tolist") else list(group_index)
    if len(keys) != batch_size:
        raise ValueError(f"group_index has {len(keys)} entries, batch has {batch_size} sequences")
    dense: dict[Any, int] = {}
    return torch.tensor([dense.setdefault(k, len(dense)) for k in keys], dtype=torch.long)


def group_stats(scores: torch.Tensor, ids: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """Per-sequence (group count, group sum, group mean, unbiased group std), gathered by id."""
    ids = ids.to(scores.device)
    n_groups = int(ids.max()) + 1 if ids.numel() else 0
    count = torch.zeros(n_groups, dtype=scores.dtype, device=scores.device).index_add_(0, ids, torch.ones_like(scores))
    total = torch.zeros_like(count).index_add_(0, ids, scores)
    mean = total / count
    sq = torch.zeros_like(count).index_add_(0, ids, (scores - mean[ids]) ** 2)
    std = (sq / (count - 1).clamp(min=1)).sqrt()
    return count[ids], total[ids], mean[ids], std[ids]


def outcome_scores(rewards: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    return masked_sum(rewards, mask, dim=-1)


def broadcast(per_seq: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    return torch.where(mask != 0, per_seq.unsqueeze(-1), zero(per_seq))
