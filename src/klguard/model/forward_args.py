"""Which keyword arguments a Hugging Face causal LM's ``forward`` takes, across transformers releases."""

from __future__ import annotations

import functools
import inspect
from typing import NamedTuple

__all__ = ["ForwardArgs", "forward_args"]


class ForwardArgs(NamedTuple):
    cache: str  # the KV cache: ``cache`` (transformers 5) or ``past_key_values``
    keep: str | None  # logits only for the last positions: ``logits_to_keep`` / ``num_logits_to_keep`` / none
    cache_position: bool  # takes ``cache_position`` (older releases; newer static caches count their own length)


@functools.cache
def forward_args(model_cls: type) -> ForwardArgs:
    params = inspect.signature(model_cls.forward).parameters
    keep = next((k for k in ("logits_to_keep", "num_logits_to_keep") if k in params), None)
    return ForwardArgs("cache" if "cache" in params else "past_key_values", keep, "cache_position" in params)
