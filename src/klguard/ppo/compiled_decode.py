"""The rollout's one-token decode step compiled with ``torch.compile`` over a transformers ``StaticCache``
(``actor_rollout_ref.rollout.enforce_eager=false``; verl's switch for vLLM's CUDA graphs).

An eager decode step of a very small model is mostly per-operation overhead (hundreds of small kernels and
the Python around them for a few matrix products); compiled, the elementwise work is fused and the Python
runs once per step. Larger models gain less: their decode step is matrix products.

The prompt is still prefilled eagerly (its length changes every batch); its keys and values are then copied
into a static cache whose shape is fixed for the rollout. Attention reads a window of it that doubles as the
sequence grows (32, 64, 128, ... positions; see ``window_for``), so early steps do not read the whole cache
and a rollout needs few graphs. One compile per (rows, cache length, window, dtype) the run meets: seconds
for small models; past ``RECOMPILE_LIMIT`` graphs, dynamo runs the step eagerly (with its own warning).

A model it cannot serve (a cache other than plain full attention, a transformers release without
ahead-of-time static caches, a sharded model under ``torch.distributed``) or a compile that fails (no C++
compiler, an unsupported operation) falls back to the eager loop with one warning. In fp32 the tokens do not
depend on which path ran; the log-probs agree up to float rounding.
"""

from __future__ import annotations

import functools
import logging
import weakref
from collections import OrderedDict

import torch
from torch import Tensor

from klguard.distributed import is_distributed
from klguard.model.forward_args import forward_args

__all__ = ["CompiledDecoder", "capacity_for", "compiled_decoder"]

log = logging.getLogger(__name__)

# Static cache lengths are rounded up to a multiple of this, so prompts of slightly different lengths
# (every batch's longest prompt differs) share one compiled graph.
LENGTH_BUCKET = 32

# Graphs the decode step may compile (shapes x windows; dynamo's default limit, 8, is one long rollout's windows).
RECOMPILE_LIMIT = 64

# Static caches kept for reuse (training and validation rollouts alternate); an older shape's is freed.
KEEP_CACHES = 2

_DECODERS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
_REFUSED: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # model -> reason, warned once


def capacity_for(prompt_length: int, response_length: int) -> int:
    """Static cache length for a rollout: prompt plus response, rounded up to ``LENGTH_BUCKET``."""
    need = prompt_length + response_length
    return -(-need // LENGTH_BUCKET) * LENGTH_BUCKET


def window_for(length: int, capacity: int) -> int:
    """How many cache positions a step attends over when ``length`` are filled: ``LENGTH_BUCKET`` doubled until
    it holds them, at most ``capacity``. Attention then reads at most twice what it needs (the whole static
    cache from the first step otherwise), and a rollout compiles one graph per window, log2(capacity / 32) + 1."""
    window = LENGTH_BUCKET
    while window < length:
        window *= 2
    return min(window, capacity)


@functools.cache
def _windowed_layer_cls() -> type:
    """A ``StaticLayer`` whose attention sees only its first ``window`` positions (the rest holds no keys yet)."""
    from transformers.cache_utils import StaticLayer

    class WindowedStaticLayer(StaticLayer):
        window: int = 0

        def update(self, key_states: Tensor, value_states: Tensor, *args, **kwargs) -> tuple[Tensor, Tensor]:
            keys, values = super().update(key_states, value_states, *args, **kwargs)
            return keys[:, :, : self.window], values[:, :, : self.window]

        def get_mask_sizes(self, *args, **kwargs) -> tuple[int, int]:
            return self.window, 0

    return WindowedStaticLayer


def unsupported_reason(model: torch.nn.Module) -> str | None:
    """Why the compiled decode step cannot serve ``model`` (None: it can)."""
    try:
        from transformers import StaticCache
        from transformers.cache_utils import StaticLayer
    except ImportError:
        return "this transformers release has no cache layers (transformers >= 4.56 has them)"
    if not hasattr(StaticCache, "early_initialization") or not hasattr(StaticLayer, "reset"):
        return "this transformers release's StaticCache cannot be filled ahead of the first step"
    if is_distributed():
        return "torch.distributed is initialised (sharded models decode eagerly)"
    if not getattr(model, "_can_compile_fullgraph", False):
        return f"{type(model).__name__} does not declare torch.compile support"
    try:
        layers = StaticCache(config=model.config, max_cache_len=LENGTH_BUCKET).layers
    except Exception as exc:  # any config transformers cannot build a static cache for
        return f"no static cache for this config ({exc})"
    if not all(type(layer) is StaticLayer for layer in layers):
        return "its cache has layers other than full attention (sliding window, ...)"
    return None


class CompiledDecoder:
    """One model's compiled decode step and its static caches, one per (rows, length, dtype)."""

    def __init__(self, model: torch.nn.Module) -> None:
        self._model = weakref.ref(model)  # the registry is keyed weakly by the model
        self._caches: OrderedDict[tuple, object] = OrderedDict()  # the last KEEP_CACHES shapes' caches
        self.eager_reason: str | None = None  # set when compiling failed; the step then runs eagerly

    def load(self, prefill: object, rows: Tensor | None, batch: int, capacity: int) -> object:
        """A static cache of ``batch`` rows and ``capacity`` positions holding the prompt keys and values of
        ``prefill`` (a filled ``DynamicCache``): its row ``rows[i]`` becomes row ``i`` (all rows in order when
        None). The cache is reused by later rollouts of the same shape (the last ``KEEP_CACHES`` shapes)."""
        from transformers import StaticCache

        first = prefill.layers[0].keys
        key = (batch, capacity, first.dtype, first.device)
        cache = self._caches.pop(key, None)
        if cache is None:
            model = self._model()
            cache = StaticCache(config=model.config, max_cache_len=capacity)
            cache.layers = [_windowed_layer_cls()(max_cache_len=capacity) for _ in cache.layers]
            cache.early_initialization(batch, [layer.keys.shape[1] for layer in prefill.layers],
                                       [layer.keys.shape[-1] for layer in prefill.layers], first.dtype, first.device)
        self._caches[key] = cache  # most recent last; a new cache of a known shape does not recompile
        while len(self._caches) > KEEP_CACHES:
            self._caches.popitem(last=False)
        plen = first.shape[-2]
        for static, filled in zip(cache.layers, prefill.layers, strict=True):
            keys, values = filled.keys, filled.values
            if rows is not None:
                keys, values = keys.index_select(0, rows), values.index_select(0, rows)
            static.keys[:, :, :plen].copy_(keys)
            static.values[:, :, :plen].copy_(values)
            static.keys[:, :, plen:].zero_()  # masked, but a stale non-finite value would still poison the sum
            static.values[:, :, plen:].zero_()
            if hasattr(static, "cumulative_length"):  # releases that count the length in the layer
                static.cumulative_length.fill_(plen)
        return cache

    def step(self, ids: Tensor, mask: Tensor, pos: Tensor, written: int, cache: object) -> Tensor:
        """Logits ``[B, 1, V]`` of the next token after ``ids`` (``[B, 1]``), whose keys and values go to cache
        position ``written``; ``mask`` is the whole ``[B, capacity]`` attention mask. Attention reads the first
        ``window_for(written + 1, capacity)`` positions."""
        model = self._model()
        window = window_for(written + 1, mask.shape[1])
        for layer in cache.layers:
            layer.window = window
        mask = mask[:, :window]
        cache_kw, _, takes_position = forward_args(type(model))
        kwargs = {cache_kw: cache}
        if takes_position:
            kwargs["cache_position"] = torch.tensor([written], device=ids.device)
        if self.eager_reason is None:
            try:
                with torch._dynamo.config.patch(recompile_limit=RECOMPILE_LIMIT):
                    return _compiled_step()(model, ids, mask, pos, kwargs)
            except Exception as exc:  # compiler missing or unsupported op: the eager step is exact
                first_line = (str(exc).strip().splitlines() or [""])[0]
                self.eager_reason = f"{type(exc).__name__}: {first_line}"[:300]
                log.warning("klguard: compiling the decode step failed (%s); decoding eagerly", self.eager_reason)
        return _step(model, ids, mask, pos, kwargs)


def _step(model: torch.nn.Module, ids: Tensor, mask: Tensor, pos: Tensor, cache_kwargs: dict) -> Tensor:
    return model(input_ids=ids, attention_mask=mask, position_ids=pos, use_cache=True, logits_to_keep=1,
                 **cache_kwargs).logits


@functools.cache
def _compiled_step():
    """``_step`` under ``torch.compile``: one graph per (model, shapes, dtype) it meets, guarded by dynamo."""
    return torch.compile(_step, dynamic=False)


def compiled_decoder(model: torch.nn.Module) -> CompiledDecoder | None:
    """The model's ``CompiledDecoder`` (built once), or None, with one warning, when it cannot have one."""
    decoder = _DECODERS.get(model)
    if decoder is not None or model in _REFUSED:
        return decoder
    reason = unsupported_reason(model)
    if reason is not None:
        _REFUSED[model] = reason
        log.warning("klguard: rollout.enforce_eager=false has no effect for this model: %s", reason)
        return None
    decoder = _DECODERS[model] = CompiledDecoder(model)
    return decoder
