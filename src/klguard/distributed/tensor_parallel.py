"""Tensor parallelism inside FSDP2 (`strategy: fsdp_turbo`: FSDP3D, FSDP2 x tensor parallelism, without the pipeline).

Each decoder layer is split over the `tp` ranks of the mesh with DTensor's `parallelize_module`, as torchtitan's
`parallelize_llama`: q/k/v, gate and up by columns (each rank holds whole attention heads and a slice of the
MLP), o and down by rows (one all-reduce after attention, one after the MLP). The token embedding is split by
vocabulary rows and lm_head by vocabulary columns, its logits gathered whole on every tp rank, so what
follows the forward (log-probs, entropy, sampling) sees a plain tensor, the same on every tp rank. A model that
ties lm_head to the embedding (Qwen2's small sizes) keeps that one matrix whole on each tp rank: one plan cannot
split a shared weight two ways. A value or classification head (`score`, one column) stays whole. FSDP2 then
shards over the data-parallel ranks.

Sequence parallelism on the norms is not applied: it splits activations along the sequence, which pays only
when activation memory is the limit (long sequences), and klguard's shared-prompt and KV-cache paths slice
positions; the norms stay replicated.

The tp ranks of one data-parallel group hold the same rows and compute the same values, so rows are split and
reduced over the data-parallel ranks only (klguard.distributed.context.data_parallel).
"""

from __future__ import annotations

import logging

import torch
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import Replicate
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

from klguard.errors import ConfigError

# DTensor logs a warning at every redistribution over two mesh dimensions (a gradient norm or a full state dict on
# the (dp, tp) mesh is two collectives, not one): at every step, on every rank. The numbers are right (the debug
# checks assert every rank's); the cost is one more small collective.
logging.getLogger("torch.distributed.tensor._redistribute").setLevel(logging.ERROR)

TP_MODEL_TYPES = ("llama", "qwen2", "mistral")  # one layout: model.layers.N.{self_attn,mlp}.*_proj

LAYER_PLAN = {
    "self_attn.q_proj": ColwiseParallel, "self_attn.k_proj": ColwiseParallel, "self_attn.v_proj": ColwiseParallel,
    "self_attn.o_proj": RowwiseParallel,
    "mlp.gate_proj": ColwiseParallel, "mlp.up_proj": ColwiseParallel, "mlp.down_proj": RowwiseParallel,
}


def check_tensor_parallel(config, tp: int, key: str) -> None:
    """A one-line ConfigError naming `key` when a model of HF `config` cannot be split over `tp` ranks."""
    model_type = getattr(config, "model_type", type(config).__name__)
    if model_type not in TP_MODEL_TYPES:
        raise ConfigError(f"{key}={tp}: tensor parallelism supports the {', '.join(TP_MODEL_TYPES)} layouts, not "
                          f"model_type {model_type!r}; set it to 1")
    sizes = {"num_attention_heads": config.num_attention_heads,
             "num_key_value_heads": getattr(config, "num_key_value_heads", None) or config.num_attention_heads,
             "intermediate_size": config.intermediate_size}
    for name, size in sizes.items():
        if size % tp:
            raise ConfigError(f"{key}={tp} must divide the model's {name}={size}")


def _plan(model: torch.nn.Module) -> dict:
    plan = {}
    if not getattr(model.config, "tie_word_embeddings", False):
        plan["model.embed_tokens"] = RowwiseParallel(input_layouts=Replicate())
        if isinstance(getattr(model, "lm_head", None), torch.nn.Linear):
            plan["lm_head"] = ColwiseParallel(output_layouts=Replicate())
    for index in range(len(model.model.layers)):
        plan |= {f"model.layers.{index}.{name}": style() for name, style in LAYER_PLAN.items()}
    return plan


def apply_tensor_parallel(model: torch.nn.Module, tp_mesh: DeviceMesh, key: str) -> torch.nn.Module:
    """`model` split in place over `tp_mesh` (checked first: see check_tensor_parallel)."""
    check_tensor_parallel(model.config, tp_mesh.size(), key)
    return parallelize_module(model, tp_mesh, _plan(model))
