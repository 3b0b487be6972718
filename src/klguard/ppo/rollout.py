"""Batched rollout sampling with a KV cache, and log-prob recomputation for PPO.

``generate`` runs a manual decode loop over any Hugging Face causal LM (its own ``DynamicCache``),
handling left-padded prompts via explicit ``position_ids`` so a padded row behaves exactly like the
same prompt alone. Runs of identical consecutive prompts (GRPO groups) are prefilled once and their
cache rows copied. ``compute_logprobs`` recomputes response log-probs with one forward pass.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import NamedTuple

import torch
from torch import Tensor

from klguard.distributed import gather_rows, is_distributed
from klguard.ppo.compiled_decode import capacity_for, compiled_decoder
from klguard.ppo.forward import forward_logits, position_ids_from_mask, prompt_runs, run_rows, token_logprobs

__all__ = ["RolloutBatch", "SamplingParams", "filter_logits", "generate", "generate_rows"]


@dataclass(frozen=True)
class SamplingParams:
    """How responses are sampled (``actor_rollout_ref.rollout.*``, or its ``val_kwargs`` at validation)."""

    max_new_tokens: int
    eos_token_id: int | list[int]
    pad_token_id: int
    temperature: float = 1.0
    top_k: int = -1  # -1: off
    top_p: float = 1.0
    do_sample: bool = True  # False, or temperature <= 0: greedy
    ignore_eos: bool = False  # generate max_new_tokens whatever the EOS
    compile_step: bool = False  # the compiled decode step over a static cache (klguard.ppo.compiled_decode)
    share_prefill: bool = True  # prefill each run of identical consecutive prompts once (same tokens either way)

    @property
    def greedy(self) -> bool:
        return not self.do_sample or self.temperature <= 0

    @classmethod
    def of(cls, settings, tokenizer, *, max_new_tokens: int, compile_step: bool) -> SamplingParams:
        """From a config section with temperature, top_k, top_p, do_sample (and ignore_eos): `rollout` or its
        `val_kwargs`; EOS and padding from the tokenizer."""
        return cls(max_new_tokens=max_new_tokens, eos_token_id=tokenizer.eos_token_id,
                   pad_token_id=tokenizer.pad_token_id, temperature=settings.temperature, top_k=settings.top_k,
                   top_p=settings.top_p, do_sample=settings.do_sample,
                   ignore_eos=getattr(settings, "ignore_eos", False), compile_step=compile_step)


@dataclass
class RolloutBatch:
    """Everything PPO needs from one rollout; response tensors have fixed width ``max_new_tokens``."""

    prompt_ids: Tensor  # [B, P] left-padded
    prompt_mask: Tensor  # [B, P]
    response_ids: Tensor  # [B, R] right-padded with pad_token_id after EOS
    response_mask: Tensor  # [B, R] 1 up to and including EOS
    old_logprobs: Tensor  # [B, R] log_softmax(logits / T) of the sampled token (pre top-k/top-p); 0 if masked
    response_lengths: Tensor  # [B]

    @property
    def input_ids(self) -> Tensor:
        """Prompt followed by response, ``[B, P + R]``."""
        return torch.cat([self.prompt_ids, self.response_ids], dim=1)

    @property
    def attention_mask(self) -> Tensor:
        """Mask matching :attr:`input_ids`."""
        return torch.cat([self.prompt_mask, self.response_mask.to(self.prompt_mask.dtype)], dim=1)


@functools.cache
def _prealloc_layer_cls() -> type:
    """A ``DynamicLayer`` that writes into one buffer sized for the whole rollout instead of ``torch.cat``."""
    from transformers.cache_utils import DynamicLayer

    class PreallocLayer(DynamicLayer):
        def __init__(self, capacity: int) -> None:
            super().__init__()
            self.capacity, self.length = capacity, 0

        def update(self, key_states: Tensor, value_states: Tensor, *args, **kwargs) -> tuple[Tensor, Tensor]:
            if not self.is_initialized:
                b, h, _, d = key_states.shape
                self.device, self.is_initialized = key_states.device, True
                self._k = key_states.new_empty(b, h, self.capacity, d)
                self._v = value_states.new_empty(b, h, self.capacity, value_states.shape[-1])
            start, self.length = self.length, self.length + key_states.shape[-2]
            self._k[:, :, start : self.length].copy_(key_states)
            self._v[:, :, start : self.length].copy_(value_states)
            self.keys, self.values = self._k[:, :, : self.length], self._v[:, :, : self.length]
            return self.keys, self.values

        def reorder_cache(self, beam_idx: Tensor) -> None:
            """Rows ``beam_idx`` of the cache (any count, repeats allowed); the buffers keep their capacity."""
            if self.is_initialized:
                idx = beam_idx.to(self._k.device)
                self._k = self._k.new_empty(len(idx), *self._k.shape[1:])
                self._v = self._v.new_empty(len(idx), *self._v.shape[1:])
                self._k[:, :, : self.length] = self.keys.index_select(0, idx)
                self._v[:, :, : self.length] = self.values.index_select(0, idx)
                self.keys, self.values = self._k[:, :, : self.length], self._v[:, :, : self.length]

        # the other row/length edits of DynamicLayer, kept in step with the buffers (klguard itself uses none)
        def batch_repeat_interleave(self, repeats: int) -> None:
            if self.is_initialized:
                self.reorder_cache(torch.arange(self._k.shape[0], device=self._k.device).repeat_interleave(repeats))

        def batch_select_indices(self, indices: Tensor) -> None:
            self.reorder_cache(indices)

        def crop(self, tokens_to_remove: int) -> None:
            super().crop(tokens_to_remove)
            if self.is_initialized:
                self.length = self.keys.shape[-2]

    return PreallocLayer


def _new_cache(model: torch.nn.Module, capacity: int) -> object:
    """The model's ``DynamicCache``; its plain full-attention layers are swapped for preallocated ones."""
    from transformers import DynamicCache

    try:
        cache = DynamicCache(config=model.config)
    except TypeError:  # older transformers
        return DynamicCache()
    layers = getattr(cache, "layers", None)
    if layers and all(type(layer).__name__ == "DynamicLayer" for layer in layers):
        layer_cls = _prealloc_layer_cls()
        cache.layers = [layer_cls(capacity) for _ in layers]
    return cache


def filter_logits(logits: Tensor, top_k: int = -1, top_p: float = 1.0) -> Tensor:
    """Top-k then top-p (nucleus) filtering, vLLM/verl semantics; removed entries become ``-inf``."""
    vocab = logits.shape[-1]
    if 0 < top_k < vocab:
        kth = torch.topk(logits, top_k, dim=-1).values[..., -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if top_p < 1.0:
        sorted_logits, idx = torch.sort(logits, dim=-1)
        cum = sorted_logits.softmax(-1).cumsum(-1)
        remove = cum <= (1.0 - top_p)
        remove[..., -1] = False  # always keep the most likely token
        logits = logits.masked_fill(remove.scatter(-1, idx, remove), float("-inf"))
    return logits


def _sample(probs: Tensor, generator: torch.Generator | None, rows: tuple[Tensor, int] | None = None) -> Tensor:
    """One draw per row by inverse-CDF (``B`` uniforms; ``torch.multinomial`` draws one per vocab entry).

    ``rows = (index, total)``: these are rows ``index`` of a batch of ``total`` split over ranks; each takes the
    uniform it would take in the whole batch, so a row samples the same tokens at any world size."""
    dtype = torch.float32 if probs.device.type == "mps" else torch.float64  # MPS has no float64
    cdf = probs.to(dtype).cumsum(-1)
    if rows is None:
        u = torch.rand(probs.shape[0], 1, dtype=dtype, device=probs.device, generator=generator)
    else:
        u = torch.rand(rows[1], 1, dtype=dtype, device=probs.device, generator=generator)[rows[0]]
    tok = torch.searchsorted(cdf, u * cdf[:, -1:], right=True).squeeze(-1)
    return tok.clamp_(max=probs.shape[-1] - 1)


def _pick(logits: Tensor, greedy: bool, temperature: float, top_k: int, top_p: float,
          generator: torch.Generator | None, rows: tuple[Tensor, int] | None = None) -> tuple[Tensor, Tensor]:
    """Choose next tokens ``[B]`` and return them with their log-probs ``[B]`` before top-k/top-p filtering (as
    verl), from the same function the updates use (``klguard.ppo.forward.token_logprobs``)."""
    logits = logits.float()
    if greedy:
        tok = logits.argmax(-1)
        return tok, token_logprobs(logits, tok)
    if temperature != 1.0:
        logits = logits / temperature
    filtered = top_k > 0 or top_p < 1.0
    tok = _sample((filter_logits(logits, top_k, top_p) if filtered else logits).softmax(-1), generator, rows)
    return tok, token_logprobs(logits, tok)


def generate(model: torch.nn.Module, prompt_ids: Tensor, prompt_mask: Tensor, params: SamplingParams, *,
             generator: torch.Generator | None = None, sample_rows: tuple[Tensor, int] | None = None
             ) -> RolloutBatch:
    """Sample up to ``params.max_new_tokens`` per left-padded prompt using the model's KV cache.

    ``sample_rows`` (see ``_sample``): the prompts are these rows of a larger batch split over ranks. With
    ``params.compile_step`` the decode step runs compiled over a static cache (``klguard.ppo.compiled_decode``;
    it falls back to the eager loop where it cannot run).

    The decode loop runs under ``torch.inference_mode`` (``no_grad`` under autocast); the returned tensors are
    ordinary (cloned outside it) so the trainer can use them in autograd-tracked computations (e.g. embedding lookups
    in the PPO update).
    """
    # Under bf16 autocast, no_grad: autocast keeps its bf16 copy of each weight for the whole rollout only outside
    # inference mode (inside it, every weight is cast again at every decode step).
    autocast = torch.is_autocast_enabled(prompt_ids.device.type)
    with torch.no_grad() if autocast else torch.inference_mode():
        out = _decode(model, prompt_ids, prompt_mask, params, generator, sample_rows)
    response, resp_mask, logprobs = (t.clone() for t in out)
    return RolloutBatch(prompt_ids, prompt_mask, response, resp_mask, logprobs, resp_mask.sum(-1))


def generate_rows(model: torch.nn.Module, prompt_ids: Tensor, prompt_mask: Tensor, index: Tensor, order: Tensor,
                  params: SamplingParams, *, generator: torch.Generator | None = None) -> RolloutBatch:
    """``generate`` for this rank's rows ``index`` of the batch, then every rank's rows gathered back in batch
    order (``order``: all ranks' indices, in rank order); each row samples as it would in the whole batch.
    One process: plain ``generate`` of the whole batch. The model must not need collectives per forward
    (sharded models are unsharded around this, klguard.distributed.fsdp.unsharded)."""
    if not is_distributed():
        return generate(model, prompt_ids, prompt_mask, params, generator=generator)
    idx = index.to(prompt_ids.device)
    if len(idx):
        out = generate(model, prompt_ids[idx], prompt_mask[idx], params, generator=generator,
                       sample_rows=(idx, len(prompt_ids)))
        parts = (out.response_ids, out.response_mask, out.old_logprobs)
    else:  # more ranks than rows (a small validation batch)
        width = params.max_new_tokens
        parts = (prompt_ids.new_empty(0, width), prompt_ids.new_empty(0, width),
                 torch.empty(0, width, device=prompt_ids.device))
    response, mask, logprobs = (gather_rows(t, order) for t in parts)
    return RolloutBatch(prompt_ids, prompt_mask, response, mask, logprobs, mask.sum(-1))


class _Buffers(NamedTuple):
    """What the decode loop writes, one column per step: nothing grows."""

    response: Tensor  # [B, R] token ids, pad after EOS
    mask: Tensor  # [B, R] 1 up to and including EOS
    logprobs: Tensor  # [B, R] log-probs of the sampled tokens, 0 after EOS
    attn: Tensor | None  # [B, P + R] growing attention mask (views of it), None when no prompt is padded
    positions: Tensor  # [B, R] position of response token t: (valid prompt tokens + t)


def _buffers(prompt_mask: Tensor, R: int, pad_token_id: int) -> _Buffers:
    bsz, plen = prompt_mask.shape
    dev = prompt_mask.device
    attn = None
    if not bool(prompt_mask.all()):
        attn = torch.ones(bsz, plen + R, dtype=prompt_mask.dtype, device=dev)
        attn[:, :plen] = prompt_mask
    return _Buffers(torch.full((bsz, R), pad_token_id, dtype=torch.long, device=dev),
                    torch.zeros(bsz, R, dtype=torch.long, device=dev),
                    torch.zeros(bsz, R, dtype=torch.float32, device=dev), attn,
                    prompt_mask.long().sum(-1, keepdim=True) + torch.arange(R, device=dev))


def _prefill(model: torch.nn.Module, prompt_ids: Tensor, prompt_mask: Tensor, cache: object, padded: bool,
             share: bool) -> tuple[Tensor, Tensor | None]:
    """The prompts' forward into ``cache``: last-position logits ``[B, 1, V]`` and, when identical consecutive
    prompts (GRPO groups) were prefilled once, the run of each row (the caller copies their cache rows)."""
    layers = getattr(cache, "layers", None) or ()
    runs = None
    if share and layers and all(isinstance(x, _prealloc_layer_cls()) for x in layers):
        lengths = prompt_runs(prompt_ids, prompt_mask)
        runs = None if lengths is None else run_rows(lengths)
    ids, pmask = (prompt_ids, prompt_mask) if runs is None else (prompt_ids[runs[0]], prompt_mask[runs[0]])
    logits = forward_logits(model, ids, pmask if padded else None, position_ids_from_mask(pmask), 1, cache)
    return logits, None if runs is None else runs[1]


def _decode(model: torch.nn.Module, prompt_ids: Tensor, prompt_mask: Tensor, params: SamplingParams,
            generator: torch.Generator | None, sample_rows: tuple[Tensor, int] | None = None
            ) -> tuple[Tensor, Tensor, Tensor]:
    """The KV-cache decode loop; returns ``(response_ids, response_mask, old_logprobs)``."""
    bsz, plen = prompt_ids.shape
    R, eos_id = params.max_new_tokens, params.eos_token_id
    eos = torch.as_tensor([eos_id] if isinstance(eos_id, int) else list(eos_id), device=prompt_ids.device)
    buf = _buffers(prompt_mask, R, params.pad_token_id)
    alive = torch.ones(bsz, dtype=torch.bool, device=prompt_ids.device)
    # The compiled step (rollout.enforce_eager=false) decodes over a static cache the prefill is copied into.
    decoder = compiled_decoder(model) if params.compile_step else None
    cache = _new_cache(model, plen if decoder is not None else plen + R)
    pick = functools.partial(_pick, greedy=params.greedy, temperature=params.temperature, top_k=params.top_k,
                             top_p=params.top_p, generator=generator, rows=sample_rows)
    logits, row_run = _prefill(model, prompt_ids, prompt_mask, cache, buf.attn is not None, params.share_prefill)
    layers = getattr(cache, "layers", None) or ()
    static = None
    if decoder is not None and layers and all(isinstance(x, _prealloc_layer_cls()) for x in layers):
        capacity = capacity_for(plen, R)
        static = decoder.load(cache, row_run, bsz, capacity)
        static_mask = torch.ones(bsz, capacity, dtype=prompt_mask.dtype, device=prompt_ids.device)
        static_mask[:, :plen] = prompt_mask
    elif row_run is not None:
        cache.reorder_cache(row_run)
    if row_run is not None:
        logits = logits[row_run]
    for t in range(R):
        tok, lp = pick(logits[:, -1])
        buf.response[:, t] = tok.masked_fill_(~alive, params.pad_token_id)
        buf.logprobs[:, t] = lp.masked_fill_(~alive, 0.0)
        buf.mask[:, t] = alive
        if not params.ignore_eos:
            alive &= ~torch.isin(tok, eos)
            if not alive.any():
                break
        step_ids, step_pos = buf.response[:, t : t + 1], buf.positions[:, t : t + 1]
        if t + 1 < R and static is not None:
            logits = decoder.step(step_ids, static_mask, step_pos, plen + t, static)
        elif t + 1 < R:
            mask = None if buf.attn is None else buf.attn[:, : plen + t + 1]
            logits = forward_logits(model, step_ids, mask, step_pos, 1, cache)
    return buf.response, buf.mask, buf.logprobs
