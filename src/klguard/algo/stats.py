"""Masked reductions over token tensors.

A mask entry is valid when it is nonzero. Masked-out entries are never read arithmetically
(``torch.where`` instead of multiplication), so padding that holds inf/NaN cannot leak into a
statistic. Every function stays finite on an all-masked input.
"""

from __future__ import annotations

import torch

Dim = int | tuple[int, ...] | None


def _valid(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Boolean mask broadcast to ``x``'s shape."""
    return torch.broadcast_to(mask != 0, x.shape)


def _zero_masked(x: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
    # where, not x * mask: 0 * inf = NaN would poison the sum.
    return torch.where(valid, x, torch.zeros((), dtype=x.dtype, device=x.device))


def masked_sum(x: torch.Tensor, mask: torch.Tensor, dim: Dim = None) -> torch.Tensor:
    """Sum of the valid entries of ``x`` (over ``dim``, or everything when ``dim`` is None)."""
    valid = _valid(x, mask)
    xs = _zero_masked(x, valid)
    return xs.sum() if dim is None else xs.sum(dim=dim)


def masked_count(x: torch.Tensor, mask: torch.Tensor, dim: Dim = None) -> torch.Tensor:
    """Number of valid entries, in ``x``'s dtype so it can divide directly."""
    valid = _valid(x, mask).to(x.dtype)
    return valid.sum() if dim is None else valid.sum(dim=dim)


def masked_mean(x: torch.Tensor, mask: torch.Tensor, dim: Dim = None) -> torch.Tensor:
    """Mean of the valid entries; 0 where nothing is valid (count clamped to 1)."""
    count = masked_count(x, mask, dim)
    return masked_sum(x, mask, dim) / count.clamp(min=1)


def masked_var(x: torch.Tensor, mask: torch.Tensor, unbiased: bool = True) -> torch.Tensor:
    """Variance of all valid entries (a scalar).

    With ``unbiased`` the divisor is ``count - 1`` (Bessel, as verl), clamped to 1 so a single
    valid entry gives variance 0 instead of NaN; no valid entry also gives 0.
    """
    valid = _valid(x, mask)
    mean = masked_mean(x, valid)
    sq = _zero_masked((x - mean) ** 2, valid).sum()
    count = valid.to(x.dtype).sum()
    denom = count - 1 if unbiased else count
    return sq / denom.clamp(min=1)


def masked_whiten(x: torch.Tensor, mask: torch.Tensor, shift_mean: bool = True, eps: float = 1e-8) -> torch.Tensor:
    """Normalise valid entries to zero mean and unit (unbiased) variance.

    ``shift_mean=False`` keeps the original mean (only rescales). Masked-out entries are set to 0.
    A single valid entry whitens to 0 (its deviation from its own mean), never NaN.
    """
    valid = _valid(x, mask)
    mean = masked_mean(x, valid)
    var = masked_var(x, valid, unbiased=True)
    out = (x - mean) * torch.rsqrt(var + eps)
    if not shift_mean:
        out = out + mean
    return _zero_masked(out, valid)
