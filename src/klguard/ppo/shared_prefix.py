"""Shared-prompt forwards for GRPO-style batches: each prompt's positions are computed once per group.

In a GRPO batch every prompt is repeated ``n`` times in consecutive rows (identical left-padded prompt part),
followed by a different right-padded response per row. Attention is causal, so the prompt positions' hidden
states are the same for every row of a group. ``shared_prefix_forward`` therefore runs the model twice:

1. on the ``G`` unique prompts ``[G, P]``, filling a ``transformers.DynamicCache`` (under autograd when grad is
   enabled) and keeping only the last prompt position's output;
2. on the responses ``[B, R - 1]`` of all ``B`` rows, with a second cache whose every layer holds the prompt
   keys/values repeated to the rows of each group (``index_select``, whose backward sums the rows of a group,
   so gradients reach the prompt pass exactly as in one full forward).

The last response token is never an input: only outputs at positions ``-R-1 .. -2`` of ``prompt + response``
are returned, exactly those ``klguard.ppo.forward.compute_logprobs`` and ``critic_values`` read.
The model is called through its own ``forward`` (its head, autocast wrapper and dropout apply as usual), so one
code path serves a causal LM (``.logits`` ``[.., V]``) and a token-classification critic (``.logits`` ``[.., 1]``).

Supported: models whose forward takes a cache argument (``cache`` or ``past_key_values``) and whose
``DynamicCache(config=...)`` has only plain full-attention ``DynamicLayer`` layers (Llama, Qwen2, Mistral
without sliding window, GPT-2, ...). ``unsupported_reason`` says why a model is not; the forwards raise
``ValueError`` with that reason. Gradient checkpointing is refused while grad is enabled in training mode:
transformers then drops the cache inside the layers, which would silently cut the responses off their prompts.
"""

from __future__ import annotations

import inspect
import weakref

import torch
from torch import Tensor

from klguard.model.forward_args import forward_args
from klguard.ppo.forward import (
    compute_logprobs,
    critic_values,
    position_ids_from_mask,
    prompt_runs,
    run_rows,
    token_logprobs,
)

__all__ = ["prompt_groups", "sequence_logprobs", "sequence_values", "shared_prefix_forward",
           "shared_prefix_logprobs", "shared_prefix_values", "unsupported_reason"]


def prompt_groups(input_ids: Tensor, attention_mask: Tensor, prompt_length: int) -> Tensor | None:
    """Run lengths ``[G]`` (long, summing to ``B``) of consecutive rows whose first ``prompt_length`` columns
    (ids and mask) are identical; ``None`` when no run is longer than one row (nothing to share)."""
    return prompt_runs(input_ids[:, :prompt_length], attention_mask[:, :prompt_length])


def _new_cache(model: torch.nn.Module) -> object:
    from transformers import DynamicCache

    return DynamicCache(config=model.config)


_CACHE_REASONS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _cache_reason(model: torch.nn.Module) -> str | None:
    """Whether `model`'s forward and cache layers support the shared forward: fixed for a model's life, so worked
    out once per model (it builds a cache; the forwards ask at every micro-batch)."""
    if model not in _CACHE_REASONS:
        params = inspect.signature(type(model).forward).parameters
        reason = None
        if "cache" not in params and "past_key_values" not in params:
            reason = f"{type(model).__name__}.forward takes no cache argument"
        else:
            try:
                from transformers.cache_utils import DynamicLayer

                layers = _new_cache(model).layers
            except (ImportError, AttributeError, TypeError, ValueError, KeyError) as exc:
                reason = f"no per-layer DynamicCache for {type(model).__name__} ({type(exc).__name__}: {exc})"
            else:
                odd = sorted({type(layer).__name__ for layer in layers if type(layer) is not DynamicLayer})
                if odd:
                    reason = f"cache layers other than full-attention DynamicLayer: {', '.join(odd)}"
        _CACHE_REASONS[model] = reason
    return _CACHE_REASONS[model]


def unsupported_reason(model: torch.nn.Module) -> str | None:
    """Why ``shared_prefix_forward`` cannot run ``model`` (``None``: it can).

    Gradient checkpointing is refused when the model is in training mode: transformers drops the KV cache there,
    under autograd always and, in some releases (5.10's GradientCheckpointingLayer), under ``no_grad`` too."""
    reason = _cache_reason(model)
    if reason is not None:
        return reason
    if model.training and any(getattr(m, "gradient_checkpointing", False) for m in model.modules()):
        return "gradient checkpointing is on in training mode (transformers drops the KV cache under it)"
    return None


def shared_prefix_forward(model: torch.nn.Module, input_ids: Tensor, attention_mask: Tensor, response_length: int,
                          groups: Tensor, *, split: bool = False) -> Tensor | tuple[Tensor, Tensor | None]:
    """``model(input_ids, attention_mask).logits`` at positions ``-R-1 .. -2`` (``[B, R, C]``, the model's dtype),
    computing the prompt part once per group of ``groups`` (see ``prompt_groups``); grad follows the caller's mode.
    ``split``: the two parts as they come, position ``-R-1`` (``[B, 1, C]``) and the rest (``[B, R - 1, C]``, None
    when ``R == 1``), not joined (joining copies every logit: a vocabulary-sized copy for a causal LM).

    ``input_ids``/``attention_mask`` are ``[B, P + R]``: left-padded prompt, then the response
    (``R = response_length``). Position ids come from the mask as in ``klguard.ppo.forward``."""
    reason = unsupported_reason(model)
    if reason is not None:
        raise ValueError(f"shared-prefix forward unsupported: {reason}")
    bsz, total = input_ids.shape
    R = response_length
    P = total - R
    if R < 1 or P < 1:
        raise ValueError(f"need a prompt and a response: {total} columns, response_length={R}")
    dev = input_ids.device
    groups = groups.to(device=dev, dtype=torch.long)
    if groups.ndim != 1 or bool((groups < 1).any()) or int(groups.sum()) != bsz:
        raise ValueError(f"groups must be positive run lengths summing to the batch size {bsz}")
    starts, row_group = run_rows(groups)  # the first row of each group, the group of each row
    pos = position_ids_from_mask(attention_mask)
    cache_kw, keep_kw, _ = forward_args(type(model))
    keep = {keep_kw: 1} if keep_kw is not None else {}

    cache = _new_cache(model)
    out = model(input_ids=input_ids[starts, :P], attention_mask=attention_mask[starts, :P],
                position_ids=pos[starts, :P], use_cache=True, **{cache_kw: cache}, **keep)
    if cache.get_seq_length() != P:
        raise ValueError(f"{type(model).__name__} did not fill the KV cache; the shared-prefix forward cannot run it")
    head = out.logits[:, -1:].index_select(0, row_group)  # output at the last prompt position, per row
    if R == 1:
        return (head, None) if split else head

    expanded = _new_cache(model)
    for idx, layer in enumerate(cache.layers):
        expanded.update(layer.keys.index_select(0, row_group), layer.values.index_select(0, row_group), idx)
    rest = model(input_ids=input_ids[:, P:-1], attention_mask=attention_mask[:, :-1], position_ids=pos[:, P:-1],
                 use_cache=True, **{cache_kw: expanded}).logits
    return (head, rest) if split else torch.cat([head, rest], dim=1)


def shared_prefix_logprobs(model: torch.nn.Module, input_ids: Tensor, attention_mask: Tensor, response_length: int,
                           groups: Tensor | None, temperature: float = 1.0, return_entropy: bool = False,
                           entropy_grad: bool = True) -> Tensor | tuple[Tensor, Tensor]:
    """``klguard.ppo.forward.compute_logprobs`` (same return contract: fp32 ``[B, R]`` log-probs of
    ``log_softmax(logits / temperature)`` at the response tokens, and the entropy when ``return_entropy``)
    with the prompt computed once per group; ``groups=None`` runs ``compute_logprobs`` itself."""
    if groups is None:
        return compute_logprobs(model, input_ids, attention_mask, response_length, temperature,
                                return_entropy=return_entropy, entropy_grad=entropy_grad)
    head, rest = shared_prefix_forward(model, input_ids, attention_mask, response_length, groups, split=True)
    tokens = input_ids[:, -response_length:]
    parts = [token_logprobs(head, tokens[:, :1], temperature, return_entropy=return_entropy,
                            entropy_grad=entropy_grad)]
    if rest is not None:  # each part on its own: the logits are never joined (per position, the same numbers)
        parts.append(token_logprobs(rest, tokens[:, 1:], temperature, return_entropy=return_entropy,
                                    entropy_grad=entropy_grad))
    if len(parts) == 1:
        return parts[0]
    if not return_entropy:
        return torch.cat(parts, dim=1)
    return tuple(torch.cat(xs, dim=1) for xs in zip(*parts, strict=True))


def shared_prefix_values(critic: torch.nn.Module, input_ids: Tensor, attention_mask: Tensor, response_length: int,
                         groups: Tensor | None) -> Tensor:
    """``critic_values`` (fp32 ``[B, R]``: the one-label outputs at positions ``-R-1 .. -2``) with the prompt
    computed once per group; ``groups=None`` runs ``critic_values`` itself."""
    if groups is None:
        return critic_values(critic, input_ids, attention_mask, response_length)
    return shared_prefix_forward(critic, input_ids, attention_mask, response_length, groups)[..., 0].float()


def _groups_for(model: torch.nn.Module, input_ids: Tensor, attention_mask: Tensor, response_length: int,
                share: bool) -> Tensor | None:
    """The rows' prompt groups when sharing is asked for, pays (a run longer than one row) and `model` supports it."""
    if not share:
        return None
    groups = prompt_groups(input_ids, attention_mask, input_ids.shape[1] - response_length)
    return groups if groups is not None and unsupported_reason(model) is None else None


def sequence_logprobs(model: torch.nn.Module, input_ids: Tensor, attention_mask: Tensor, response_length: int,
                      temperature: float = 1.0, *, micro_batch_size: int | None = None, share_prompt: bool = True,
                      return_entropy: bool = False, entropy_grad: bool = True) -> Tensor | tuple[Tensor, Tensor]:
    """Response log-probs (and entropy) as ``compute_logprobs``, one forward per micro-batch; with
    ``share_prompt`` each micro-batch's groups of identical prompts run their prompt once (same numbers up to
    float rounding), otherwise, or when nothing is shared or the model is not supported, the plain forward."""
    mbs = micro_batch_size or len(input_ids)
    parts = [shared_prefix_logprobs(model, ids, mask, response_length,
                                    _groups_for(model, ids, mask, response_length, share_prompt), temperature,
                                    return_entropy=return_entropy, entropy_grad=entropy_grad)
             for ids, mask in zip(input_ids.split(mbs), attention_mask.split(mbs), strict=True)]
    if len(parts) == 1:
        return parts[0]
    return torch.cat(parts) if not return_entropy else tuple(torch.cat(xs) for xs in zip(*parts, strict=True))


def sequence_values(critic: torch.nn.Module, input_ids: Tensor, attention_mask: Tensor, response_length: int, *,
                    share_prompt: bool = True) -> Tensor:
    """The critic's values as ``critic_values``, the prompt computed once per group when ``share_prompt``."""
    groups = _groups_for(critic, input_ids, attention_mask, response_length, share_prompt)
    return shared_prefix_values(critic, input_ids, attention_mask, response_length, groups)
