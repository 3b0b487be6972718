"""PPO policy and value losses, loss aggregation, and log-prob/entropy helpers."""

from __future__ import annotations

import math
from typing import Literal, NamedTuple, get_args

import torch

from klguard.algo.stats import masked_count, masked_mean, masked_sum

LossAggMode = Literal["token-mean", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm"]
LOSS_AGG_MODES: tuple[str, ...] = get_args(LossAggMode)

# verl clamps the log-ratio so exp() cannot overflow when old and new policies drift apart.
_LOG_RATIO_BOUND = 20.0


def clamped_log_ratio(old_logprob: torch.Tensor, logprob: torch.Tensor) -> torch.Tensor:
    """``logprob - old_logprob`` clamped to [-20, 20], verl's bound: exp() of it stays finite."""
    return (logprob - old_logprob).clamp(-_LOG_RATIO_BOUND, _LOG_RATIO_BOUND)


def agg_loss(
    loss_mat: torch.Tensor,
    loss_mask: torch.Tensor,
    loss_agg_mode: str,
    norm_constant: float | None = None,
) -> torch.Tensor:
    """Reduce a ``[B, T]`` per-token loss to a scalar.

    - ``token-mean``: mean over all valid tokens of the batch.
    - ``seq-mean-token-sum``: mean over sequences of each sequence's token sum.
    - ``seq-mean-token-mean``: mean over sequences of each sequence's token mean.
    - ``seq-mean-token-sum-norm``: sum of all valid token losses / ``norm_constant``
      (default ``loss_mask.shape[-1]``, the padded response length, as verl).

    Sequences without a valid token are left out of the seq means, so they add no NaN and do
    not dilute the mean. Everything is 0 when no token is valid.
    """
    valid = torch.broadcast_to(loss_mask != 0, loss_mat.shape)
    if loss_agg_mode == "token-mean":
        return masked_mean(loss_mat, valid)
    if loss_agg_mode in ("seq-mean-token-sum", "seq-mean-token-mean"):
        seq_sum = masked_sum(loss_mat, valid, dim=-1)
        seq_count = masked_count(loss_mat, valid, dim=-1)
        per_seq = seq_sum if loss_agg_mode == "seq-mean-token-sum" else seq_sum / seq_count.clamp(min=1)
        return masked_mean(per_seq, seq_count > 0)
    if loss_agg_mode == "seq-mean-token-sum-norm":
        constant = float(loss_mask.shape[-1] if norm_constant is None else norm_constant)
        if not math.isfinite(constant) or constant <= 0:
            raise ValueError(f"norm_constant must be a positive finite number, got {norm_constant!r}")
        return masked_sum(loss_mat, valid) / constant
    raise ValueError(f"unknown loss_agg_mode {loss_agg_mode!r}; valid: {', '.join(LOSS_AGG_MODES)}")


class PolicyLossOutput(NamedTuple):
    """Aggregated PPO policy loss and its (detached) diagnostics."""

    pg_loss: torch.Tensor
    pg_clipfrac: torch.Tensor
    pg_clipfrac_lower: torch.Tensor
    ppo_kl: torch.Tensor


def _check_clip_args(low: float, high: float, clip_ratio_c: float) -> None:
    if not (math.isfinite(low) and 0.0 <= low < 1.0):
        raise ValueError(f"clip_ratio_low must be in [0, 1), got {low!r}")
    if not (math.isfinite(high) and high >= 0.0):
        raise ValueError(f"clip_ratio_high must be a finite number >= 0, got {high!r}")
    if not (math.isfinite(clip_ratio_c) and clip_ratio_c > 1.0):
        raise ValueError(f"clip_ratio_c must be a finite number > 1, got {clip_ratio_c!r}")


def ppo_token_losses(
    ratio: torch.Tensor,
    advantages: torch.Tensor,
    clip_low: float,
    clip_high: float,
    clip_ratio_c: float = 3.0,
    use_dual_clip: bool = True,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per-token clipped (and optionally dual-clipped) PPO loss.

    Returns ``(loss, clipped, dual_clipped)``: ``clipped`` marks tokens where the clipped
    surrogate was the larger (chosen) loss; ``dual_clipped`` marks negative-advantage tokens
    whose loss was capped at ``clip_ratio_c * |A|`` (Ye et al. 2020).
    """
    _check_clip_args(clip_low, clip_high, clip_ratio_c)
    loss_unclipped = -advantages * ratio
    loss_clipped = -advantages * ratio.clamp(1.0 - clip_low, 1.0 + clip_high)
    loss = torch.maximum(loss_unclipped, loss_clipped)
    clipped = loss_clipped > loss_unclipped
    if not use_dual_clip:
        return loss, clipped, torch.zeros_like(clipped)
    # For A < 0 the clipped loss grows without bound in the ratio; the dual clip caps it.
    loss_cap = -advantages * clip_ratio_c
    negative = advantages < 0
    dual_clipped = negative & (loss > loss_cap)
    loss = torch.where(negative, torch.minimum(loss, loss_cap), loss)
    return loss, clipped, dual_clipped


def compute_policy_loss(
    old_logprob: torch.Tensor,
    logprob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    *,
    clip_ratio: float = 0.2,
    clip_ratio_low: float | None = None,
    clip_ratio_high: float | None = None,
    clip_ratio_c: float = 3.0,
    use_dual_clip: bool = True,
    loss_agg_mode: str = "token-mean",
) -> PolicyLossOutput:
    """PPO clipped surrogate loss (verl's ``vanilla`` policy loss), aggregated by ``loss_agg_mode``.

    ``ratio = exp(clamp(logprob - old_logprob, -20, 20))``, clipped to
    ``[1 - clip_ratio_low, 1 + clip_ratio_high]`` (each defaults to ``clip_ratio``).
    Diagnostics are masked means over valid tokens: ``pg_clipfrac`` (clipped term chosen),
    ``pg_clipfrac_lower`` (dual clip active; as verl, the denominator is all valid tokens),
    ``ppo_kl`` (mean of ``old_logprob - logprob``, the k1 estimate of KL(old || new)).
    """
    low = clip_ratio if clip_ratio_low is None else clip_ratio_low
    high = clip_ratio if clip_ratio_high is None else clip_ratio_high
    ratio = torch.exp(clamped_log_ratio(old_logprob, logprob))
    loss_mat, clipped, dual_clipped = ppo_token_losses(ratio, advantages, low, high, clip_ratio_c, use_dual_clip)
    pg_loss = agg_loss(loss_mat, response_mask, loss_agg_mode)
    with torch.no_grad():
        dtype = loss_mat.dtype
        pg_clipfrac = masked_mean(clipped.to(dtype), response_mask)
        pg_clipfrac_lower = masked_mean(dual_clipped.to(dtype), response_mask)
        ppo_kl = masked_mean(old_logprob - logprob, response_mask)
    return PolicyLossOutput(pg_loss, pg_clipfrac, pg_clipfrac_lower, ppo_kl)


def compute_value_loss(
    vpreds: torch.Tensor,
    values: torch.Tensor,
    returns: torch.Tensor,
    response_mask: torch.Tensor,
    *,
    cliprange_value: float = 0.5,
    loss_agg_mode: str = "token-mean",
) -> tuple[torch.Tensor, torch.Tensor]:
    """Clipped value loss ``0.5 * max((v - R)^2, (clip(v, old - c, old + c) - R)^2)``, as verl.

    Returns ``(vf_loss, vf_clipfrac)``; the clip fraction is the share of valid tokens where
    the clipped term was the larger one.
    """
    if not (math.isfinite(cliprange_value) and cliprange_value >= 0):
        raise ValueError(f"cliprange_value must be a finite number >= 0, got {cliprange_value!r}")
    vpred_clipped = torch.clamp(vpreds, values - cliprange_value, values + cliprange_value)
    loss_unclipped = (vpreds - returns) ** 2
    loss_clipped = (vpred_clipped - returns) ** 2
    vf_loss = 0.5 * agg_loss(torch.maximum(loss_unclipped, loss_clipped), response_mask, loss_agg_mode)
    with torch.no_grad():
        vf_clipfrac = masked_mean((loss_clipped > loss_unclipped).to(vpreds.dtype), response_mask)
    return vf_loss, vf_clipfrac


def _upcast(x: torch.Tensor) -> torch.Tensor:
    # bf16/fp16 logits lose too much precision in softmax sums; compute in >= float32.
    return x.to(torch.promote_types(x.dtype, torch.float32))


def entropy_from_logits(logits: torch.Tensor, chunk_size: int = 4096) -> torch.Tensor:
    """Per-position entropy of ``softmax(logits)`` over the last axis: ``logsumexp - sum(p * x)``.

    Rows are processed ``chunk_size`` at a time so the float32 temporaries stay bounded at
    ``chunk_size * V`` regardless of the batch size. ``-inf`` logits (banned tokens) are fine.
    """
    flat = logits.reshape(-1, logits.shape[-1])
    parts = []
    for chunk in flat.split(chunk_size):
        x = _upcast(chunk)
        p = torch.softmax(x, dim=-1)
        # Zero -inf logits (p = 0) before the product so neither value nor gradient is 0 * inf.
        x_safe = torch.where(p > 0, x, torch.zeros((), dtype=x.dtype, device=x.device))
        parts.append(torch.logsumexp(x, dim=-1) - (p * x_safe).sum(dim=-1))
    out = torch.cat(parts) if parts else flat.new_zeros(0, dtype=_upcast(flat).dtype)
    return out.reshape(logits.shape[:-1])


def logprobs_from_logits(logits: torch.Tensor, labels: torch.Tensor, chunk_size: int = 4096) -> torch.Tensor:
    """Log-probability of ``labels`` under ``softmax(logits)``: ``logits[label] - logsumexp``.

    Never materialises a full log-softmax; rows go ``chunk_size`` at a time (see
    ``entropy_from_logits``). ``labels`` has the shape of ``logits`` without the last axis.
    """
    if labels.shape != logits.shape[:-1]:
        raise ValueError(f"labels shape {tuple(labels.shape)} != logits shape {tuple(logits.shape)}[:-1]")
    flat = logits.reshape(-1, logits.shape[-1])
    flat_labels = labels.reshape(-1, 1).long()
    parts = []
    for chunk, lab in zip(flat.split(chunk_size), flat_labels.split(chunk_size), strict=True):
        x = _upcast(chunk)
        parts.append(x.gather(-1, lab).squeeze(-1) - torch.logsumexp(x, dim=-1))
    out = torch.cat(parts) if parts else flat.new_zeros(0, dtype=_upcast(flat).dtype)
    return out.reshape(labels.shape)


# Rows per chunk of the fused log-prob pass: about 4M logits (16 MiB in float32), so its temporaries stay small and
# are reused by the allocator instead of each being a fresh vocabulary-sized allocation the kernel must fault in.
_CHUNK_ELEMENTS = 1 << 22


def _row_blocks(logits: torch.Tensor, rows: int) -> list[tuple[int, torch.Tensor]]:
    """``(first flat row, [r, V] block)`` covering ``logits`` row by row; a strided view (``logits[:, :-1]``) is
    walked along its first axis, so only a block, never the whole tensor, is copied to flatten it."""
    vocab = logits.shape[-1]
    try:
        flat = logits.view(-1, vocab)
    except RuntimeError:
        per = math.prod(logits.shape[1:-1])
        step = max(1, rows // max(per, 1))
        return [(i * per, logits[i : i + step].reshape(-1, vocab)) for i in range(0, logits.shape[0], step)]
    return [(start, flat[start : start + rows]) for start in range(0, flat.shape[0], rows)]


class _TokenLogprobs(torch.autograd.Function):
    """``logprobs_from_logits(logits / T, labels)`` (and ``entropy_from_logits`` of it, outside autograd) in one
    chunked pass: no vocabulary-sized float32 copy of the logits, their scaled copy, softmax or gradient pieces
    beyond one chunk. The backward writes the logits' gradient chunk by chunk with the same operations autograd
    runs through the plain computation (logsumexp's ``exp(x - lse)``, then the label's ``+g``), so the values and
    gradients are the plain computation's, bit for bit."""

    @staticmethod
    def forward(ctx, logits: torch.Tensor, labels: torch.Tensor, temperature: float, with_entropy: bool):
        vocab = logits.shape[-1]
        rows = max(1, _CHUNK_ELEMENTS // max(vocab, 1))
        flat_labels = labels.reshape(-1, 1).long()
        n = flat_labels.shape[0]
        dtype = torch.promote_types(logits.dtype, torch.float32)
        logp = torch.empty(n, dtype=dtype, device=logits.device)
        lse = torch.empty(n, dtype=dtype, device=logits.device)
        ent = torch.empty(n if with_entropy else 0, dtype=dtype, device=logits.device)
        for start, block in _row_blocks(logits, rows):
            stop = start + block.shape[0]
            x = _upcast(block)
            if temperature != 1.0:
                x = x / temperature
            part = torch.logsumexp(x, dim=-1)
            lse[start:stop] = part
            logp[start:stop] = x.gather(-1, flat_labels[start:stop]).squeeze(-1) - part
            if with_entropy:
                p = torch.softmax(x, dim=-1)
                x_safe = torch.where(p > 0, x, torch.zeros((), dtype=x.dtype, device=x.device))
                ent[start:stop] = part - (p * x_safe).sum(dim=-1)
        ctx.save_for_backward(logits, flat_labels, lse)
        ctx.temperature = temperature
        ent = ent.reshape(labels.shape) if with_entropy else ent
        ctx.mark_non_differentiable(ent)
        return logp.reshape(labels.shape), ent

    @staticmethod
    def backward(ctx, grad_logp: torch.Tensor, _grad_ent: torch.Tensor):
        logits, flat_labels, lse = ctx.saved_tensors
        temperature = ctx.temperature
        vocab = logits.shape[-1]
        rows = max(1, _CHUNK_ELEMENTS // max(vocab, 1))
        g = grad_logp.reshape(-1, 1)
        grad = torch.empty(logits.shape, dtype=logits.dtype, device=logits.device)
        flat_grad = grad.view(-1, vocab)
        for start, block in _row_blocks(logits, rows):
            stop = start + block.shape[0]
            x = _upcast(block)
            if temperature != 1.0:
                x = x / temperature
            gs = g[start:stop]
            d = (-gs) * (x - lse[start:stop, None]).exp()  # logsumexp's backward of the `- lse` term
            d.scatter_add_(-1, flat_labels[start:stop], gs)  # gather's: the label's +g
            if temperature != 1.0:
                d = d / temperature
            flat_grad[start:stop] = d
        return grad, None, None, None


def token_logprobs_and_entropy(logits: torch.Tensor, labels: torch.Tensor, temperature: float = 1.0, *,
                               entropy: bool = False) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Log-probs of ``labels`` under ``softmax(logits / temperature)`` in float32 (differentiable), and with
    ``entropy`` the entropy of that distribution per position (not differentiable; None without ``entropy``).

    The same numbers as ``logprobs_from_logits(logits.float() / temperature, labels)`` and ``entropy_from_logits``
    of the same tensor, computed chunk by chunk in one pass (``_TokenLogprobs``): the peak memory of a 49k
    vocabulary is one chunk, plus the logits' gradient in backward."""
    if labels.shape != logits.shape[:-1]:
        raise ValueError(f"labels shape {tuple(labels.shape)} != logits shape {tuple(logits.shape)}[:-1]")
    logp, ent = _TokenLogprobs.apply(logits, labels, float(temperature), entropy)
    return logp, ent if entropy else None
