"""PPO updates: `ppo_epochs` x mini-batches x micro-batches for the actor and the critic.

Each mini-batch is one optimizer step; micro-batches accumulate gradients with weight
micro/mini as verl does. A mini-batch whose loss or gradient norm is not finite is skipped, never
applied, and named in the list of skipped terms each update returns (e.g. `actor/pg_loss`, `critic/grad_norm`).

Under torchrun each rank holds its share of every mini-batch (klguard.distributed.layout): FSDP averages the
gradients over ranks, every rank runs the same backwards and skips the same mini-batches, and the metrics
are means over all ranks' micro-batches.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Callable, Iterator
from dataclasses import dataclass, fields

import torch
from torch import Tensor

from klguard.algo.kl import kl_penalty
from klguard.algo.loss import agg_loss, compute_value_loss
from klguard.algo.policy_loss_registry import get_policy_loss
from klguard.algo.stats import masked_mean
from klguard.config.batches import UpdateBatches
from klguard.config.schema import ActorConfig, CriticConfig
from klguard.distributed import any_rank, is_distributed, reduce_means
from klguard.distributed.grad_clip import clip_grad_norm
from klguard.guard.signals import POLICY_RATIO
from klguard.ppo.shared_prefix import sequence_logprobs, sequence_values


@dataclass
class PPOBatch:
    """The rollouts of one step, everything the updates read; tensors share the first dim N."""

    input_ids: Tensor  # [N, P+R]
    attention_mask: Tensor  # [N, P+R]
    response_mask: Tensor  # [N, R]
    old_logprobs: Tensor  # [N, R]
    advantages: Tensor  # [N, R]
    returns: Tensor  # [N, R]
    values: Tensor | None = None  # [N, R], critic's values at rollout time
    ref_logprobs: Tensor | None = None  # [N, R], for the KL loss
    vpreds: Tensor | None = None  # [N, R], the critic's forward with its graph when it served as `values` too

    def __len__(self) -> int:
        return self.input_ids.shape[0]

    @property
    def response_length(self) -> int:
        return self.response_mask.shape[1]

    def select(self, index: Tensor) -> PPOBatch:
        return PPOBatch(**{f.name: None if (v := getattr(self, f.name)) is None else v[index]
                           for f in fields(self)})


def minibatch_indices(n: int, size: int, shuffle: bool, generator: torch.Generator | None) -> Iterator[Tensor]:
    order = torch.randperm(n, generator=generator) if shuffle else torch.arange(n)
    yield from order.split(size)


def critic_values_in_update(cfg: CriticConfig, rows: int, batches: UpdateBatches) -> bool:
    """True when the critic takes one optimizer step over all `rows` in one micro-batch (one epoch, one
    mini-batch). Its weights are then the same at rollout time and in the update, so one forward with
    autograd gives both the rollout-time values and the update's predictions (`PPOBatch.vpreds`); the
    separate no-grad values pass, a whole forward of the critic, is saved. Numerics are unchanged."""
    return cfg.ppo_epochs == 1 and batches.mini_rows >= rows and batches.micro_rows >= rows


class NonFiniteError(Exception):
    """A value the step depends on is NaN or infinite; `where` names it (e.g. `rewards`)."""

    def __init__(self, where: str) -> None:
        super().__init__(f"non-finite values in {where}")
        self.where = where


def check_finite(tensors: dict[str, Tensor | None], mask: Tensor | None = None) -> None:
    """Raise NonFiniteError naming the first tensor with a NaN/Inf (at `mask`ed positions when its shape fits)."""
    for name, tensor in tensors.items():
        if tensor is None:
            continue
        values = tensor[mask.bool()] if mask is not None and tensor.shape == mask.shape else tensor
        if not torch.isfinite(values).all():
            raise NonFiniteError(name)


def _apply_step(params: list[Tensor], optimizer: torch.optim.Optimizer, grad_clip: float) -> float:
    """Clip, then step only when the gradient norm is finite; returns the pre-clip norm."""
    max_norm = grad_clip if grad_clip > 0 else math.inf
    grad_norm = clip_grad_norm(params, max_norm)  # sharded: the global norm
    if math.isfinite(grad_norm):
        optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return grad_norm


def _optimized(optimizer: torch.optim.Optimizer) -> list[Tensor]:
    """The parameters the optimizer steps (a sharded model's own list may hold gathered copies meanwhile)."""
    return [p for group in optimizer.param_groups for p in group["params"]]


def _nonfinite_loss(loss: Tensor, stats: dict[str, float], prefix: str) -> str | None:
    """The first non-finite loss term's metric name (`{prefix}/loss` if only the total is)."""
    bad = next((k for k, v in stats.items() if not math.isfinite(v)), None)
    return bad or (None if math.isfinite(loss.item()) else f"{prefix}/loss")


LossFn = Callable[[PPOBatch], tuple[Tensor, dict[str, float]]]


def _run_updates(params: list[Tensor], optimizer: torch.optim.Optimizer, batch: PPOBatch, loss_fn: LossFn, *,
                 epochs: int, mini_batch_size: int, micro_batch_size: int, shuffle: bool, grad_clip: float,
                 generator: torch.Generator | None, prefix: str) -> tuple[dict[str, list[float]], list[str]]:
    """`epochs` x mini-batches (one optimizer step each) x micro-batches (accumulated, weight micro/mini).
    Returns the metrics' values and the names of the non-finite terms whose mini-batches were not applied (their
    non-finite values stay out of the metrics)."""
    acc: dict[str, list[float]] = defaultdict(list)
    nonfinite: list[str] = []
    sharded = is_distributed()  # FSDP reduces gradients in backward: every rank must run every backward
    for _ in range(epochs):
        for mini_idx in minibatch_indices(len(batch), mini_batch_size, shuffle, generator):
            mini = batch.select(mini_idx)
            bad = None
            for micro_idx in torch.arange(len(mini)).split(micro_batch_size):
                part = mini.select(micro_idx)
                loss, stats = loss_fn(part)
                bad = bad or _nonfinite_loss(loss, stats, prefix)
                if bad is None or sharded:
                    (loss * (len(part) / len(mini))).backward()
                for key, value in stats.items():
                    if math.isfinite(value):
                        acc[key].append(value)
            if sharded and any_rank(bad is not None):
                bad = bad or f"{prefix}/loss"  # another rank's loss was not finite
            if bad is None:
                grad_norm = _apply_step(params, optimizer, grad_clip)
                bad = None if math.isfinite(grad_norm) else f"{prefix}/grad_norm"
            else:
                optimizer.zero_grad(set_to_none=True)
            if bad is None:
                acc[f"{prefix}/grad_norm"].append(grad_norm)
            elif bad not in nonfinite:
                nonfinite.append(bad)
            acc[f"{prefix}/skipped_steps"].append(0.0 if bad is None else 1.0)
    return acc, nonfinite


def update_actor(model: torch.nn.Module, optimizer: torch.optim.Optimizer, batch: PPOBatch, cfg: ActorConfig, *,
                 batches: UpdateBatches, temperature: float, generator: torch.Generator | None = None,
                 grad_clip: float | None = None, share_prompt: bool = False,
                 kl_loss_coef: float | None = None) -> tuple[dict[str, float], list[str]]:
    """One PPO policy update over `batch`; returns verl-named actor metrics and the non-finite terms whose
    mini-batches were skipped (`_run_updates`).
    `share_prompt`: a micro-batch's groups of identical prompts run their prompt once (klguard.ppo.shared_prefix).
    `kl_loss_coef`: the KL loss's coefficient when a controller steers it (None: `cfg.kl_loss_coef`)."""
    model.train()
    coef = cfg.kl_loss_coef if kl_loss_coef is None else kl_loss_coef
    acc, nonfinite = _run_updates(
        _optimized(optimizer), optimizer, batch,
        lambda part: _actor_loss(model, part, cfg, temperature, share_prompt, coef), epochs=cfg.ppo_epochs,
        mini_batch_size=batches.mini_rows, micro_batch_size=batches.micro_rows,
        shuffle=cfg.shuffle, grad_clip=cfg.grad_clip if grad_clip is None else grad_clip, generator=generator,
        prefix="actor")
    metrics = reduce_means(acc)
    metrics["actor/lr"] = optimizer.param_groups[0]["lr"]
    return metrics, nonfinite


def _actor_loss(model: torch.nn.Module, part: PPOBatch, cfg: ActorConfig, temperature: float, share_prompt: bool,
                kl_loss_coef: float) -> tuple[Tensor, dict[str, float]]:
    # entropy through autograd only when it is in the loss: its backward runs a softmax over the vocabulary
    logprobs, entropy = sequence_logprobs(model, part.input_ids, part.attention_mask, part.response_length,
                                          temperature, share_prompt=share_prompt, return_entropy=True,
                                          entropy_grad=cfg.entropy_coeff != 0)
    mask = part.response_mask
    out = get_policy_loss(cfg.policy_loss.loss_mode)(part.old_logprobs, logprobs, part.advantages, mask, cfg)
    entropy_loss = agg_loss(entropy, mask, cfg.loss_agg_mode)
    loss = out.pg_loss - cfg.entropy_coeff * entropy_loss if cfg.entropy_coeff != 0 else out.pg_loss
    stats = {
        "actor/pg_loss": out.pg_loss.item(),
        "actor/pg_clipfrac": out.pg_clipfrac.item(),
        "actor/pg_clipfrac_lower": out.pg_clipfrac_lower.item(),
        "actor/ppo_kl": out.ppo_kl.item(),
        POLICY_RATIO: masked_mean(torch.exp(logprobs.detach() - part.old_logprobs), mask).item(),
        "actor/entropy": entropy_loss.item(),
    }
    if cfg.use_kl_loss:
        if part.ref_logprobs is None:
            raise ValueError("use_kl_loss needs reference log-probs in the batch")
        kl = kl_penalty(logprobs, part.ref_logprobs, cfg.kl_loss_type)
        kl_loss = agg_loss(kl, mask, cfg.loss_agg_mode)
        loss = loss + kl_loss_coef * kl_loss
        stats["actor/kl_loss"] = kl_loss.item()
        stats["actor/kl_coef"] = kl_loss_coef
    return loss, stats


def _critic_loss(critic: torch.nn.Module, part: PPOBatch, cfg: CriticConfig, share_prompt: bool
                 ) -> tuple[Tensor, dict[str, float]]:
    vpreds = part.vpreds if part.vpreds is not None else sequence_values(
        critic, part.input_ids, part.attention_mask, part.response_length, share_prompt=share_prompt)
    vf_loss, vf_clipfrac = compute_value_loss(vpreds, part.values, part.returns, part.response_mask,
                                              cliprange_value=cfg.cliprange_value, loss_agg_mode=cfg.loss_agg_mode)
    return vf_loss, {"critic/vf_loss": vf_loss.item(), "critic/vf_clipfrac": vf_clipfrac.item()}


def update_critic(critic: torch.nn.Module, optimizer: torch.optim.Optimizer, batch: PPOBatch, cfg: CriticConfig, *,
                  batches: UpdateBatches, generator: torch.Generator | None = None,
                  share_prompt: bool = False) -> tuple[dict[str, float], list[str]]:
    """One clipped value-function update over `batch`; returns verl-named critic metrics and the non-finite terms
    whose mini-batches were skipped. `batch.vpreds`, when
    set, is the critic's forward the values came from (see `critic_values_in_update`): it is not recomputed."""
    if batch.values is None:
        raise ValueError("the critic update needs rollout-time values")
    if batch.vpreds is not None and not critic_values_in_update(cfg, len(batch), batches):
        raise ValueError("batch.vpreds is only valid for one epoch of one mini-batch in one micro-batch")
    critic.train()
    acc, nonfinite = _run_updates(
        _optimized(optimizer), optimizer, batch,
        lambda part: _critic_loss(critic, part, cfg, share_prompt), epochs=cfg.ppo_epochs,
        mini_batch_size=batches.mini_rows, micro_batch_size=batches.micro_rows, shuffle=cfg.shuffle,
        grad_clip=cfg.grad_clip, generator=generator, prefix="critic")
    metrics = reduce_means(acc)
    metrics["critic/lr"] = optimizer.param_groups[0]["lr"]
    return metrics, nonfinite
