"""Tolerances for float comparisons of two computation paths, derived from float32 rounding (issue #16).

Kernels round differently on each x86 CPU (AVX-512, AVX2 or plain SSE code, MKL's own choices), so a tolerance
copied from what one CPU produced fails on another. Reordering or re-blocking a sum of n float32 terms moves it by
at most about n * eps32 * (the terms' scale); so a tolerance is absolute, at terms x eps32 x the scale of the
compared values, taken from the reference values at run time. A per-element relative tolerance would fail on
entries that are small only through cancellation.

Test files import it with `from tolerances import ...`: pytest puts tests/ on sys.path when it loads
tests/conftest.py (not importable itself: the sub-folders' conftest.py files shadow its module name).
"""

from __future__ import annotations

import torch
from transformers import PretrainedConfig

EPS32 = torch.finfo(torch.float32).eps


def float32_tol(reference: torch.Tensor | float, terms: int) -> float:
    """Absolute tolerance ``terms x eps32 x max|reference|`` for float32 results that two paths round differently;
    ``terms``: the number of terms whose summation order differs (or, for a deep computation, see
    `forward_terms`)."""
    reference = torch.as_tensor(reference).detach()
    return terms * EPS32 * float(reference.abs().max()) if reference.numel() else 0.0


def forward_terms(model: torch.nn.Module | PretrainedConfig) -> int:
    """``terms`` for the outputs of a transformer (logits, log-probs, entropies, values) computed by two paths
    (a batch or one row, padded or not, a KV-cache decode or one forward, compiled or eager, the prompt shared or
    not): each of its L layers sums at most W = max(hidden, intermediate) products per output (its attention sums
    over fewer keys than W in these tests), and the residual stream carries every layer's rounding on to the
    logits, so the outputs move by at most about L x W x eps32 x their scale. Takes the model or its config."""
    cfg = getattr(model, "config", model)
    width = getattr(cfg, "intermediate_size", None) or getattr(cfg, "n_inner", None) or 4 * cfg.hidden_size
    return cfg.num_hidden_layers * max(cfg.hidden_size, width)


def step_tol(before: torch.Tensor, after: torch.Tensor, terms: int) -> float:
    """Absolute tolerance for a parameter after one SGD step (``before - lr x grad``) taken by two paths whose
    gradients differ by rounding: ``terms x eps32 x max|lr x grad|`` (``max|after - before|``), plus the step's own
    rounding at the parameter's scale (the two paths may land on neighbouring floats: one ulp <= eps32 x |p|, a bound
    the norm weights, at |p| ~ 1, do reach)."""
    return float32_tol(after.detach() - before.detach(), terms) + float32_tol(after, 1)


# Training runs that differ by rounding only (1 vs 2 ranks, shared vs plain prompt forwards, compiled vs eager
# decode): for each compared metric, the logged values whose magnitude bounds its per-token terms (default: the
# metric itself). pg_loss's terms are -A x ratio, vf_loss's 0.5 (v - R)^2, the KL metrics' differences of log-probs
# (|log-prob| ~ the entropy), a mean's its entries (`X/mean`: by default `X/max` and `X/min` too, so that a mean near 0
# by cancellation, as the whitened advantages', is compared at its entries' scale).
METRIC_SCALES = {
    "actor/pg_loss": ("actor/pg_loss", "critic/advantages/max", "critic/advantages/min"),
    "actor/kl_loss": ("actor/kl_loss", "actor/entropy"),
    "actor/ppo_kl": ("actor/ppo_kl", "actor/entropy"),
    "actor/reward_kl_penalty": ("actor/reward_kl_penalty", "actor/entropy"),
    "critic/vf_loss": ("critic/vf_loss", "critic/returns/max", "critic/returns/min", "critic/values/max",
                       "critic/values/min"),
    "critic/values/mean": ("critic/values/max", "critic/values/min"),
    "critic/score/mean": ("critic/score/max", "critic/score/min"),
}


def metric_tol(records: list[dict], key: str, step: int, rows: int, model_terms: int) -> float:
    """Absolute tolerance for metric `key` at `step` of two training runs that differ by rounding only: a step's
    rounding is (model_terms + its token positions, rows x (longest prompt + longest response)) x eps32 x the scale
    of the metric's terms (METRIC_SCALES, largest over the reference run's `records`), and step s carries the
    s - 1 before it (validation before training, step 0: exact)."""
    at = next(r for r in records if r["step"] == step)
    positions = rows * (at.get("prompt_length/max", 0) + at.get("response_length/max", 0))
    scales = METRIC_SCALES.get(key, (key,) + ((key[:-4] + "max", key[:-4] + "min") if key.endswith("/mean") else ()))
    scale = max((abs(r[k]) for r in records if r["step"] for k in scales if k in r), default=0.0)
    return step * (model_terms + positions) * EPS32 * scale
