"""FSDP2 sharding: `fully_shard` on every decoder layer (the model's `_no_split_modules`) and on the root,
after the tensor-parallel plan when there is one (klguard.distributed.tensor_parallel).

`fsdp_size` < world size (and > 0) builds a 2-D (replicate x shard) mesh, HSDP; `strategy: none` with more
than one rank replicates (a mesh of world x 1: every rank holds the whole model, gradients are averaged,
as DDP). Mixed precision comes from `fsdp_config.dtype` (MixedPrecisionPolicy: bf16 compute, fp32 gradient
reduction); `offload_policy` keeps parameters and optimizer states on the CPU (CPUOffloadPolicy, CUDA only:
on a CPU device there is nowhere else to offload to).
"""

from __future__ import annotations

import time
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import torch
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
from torch.distributed.fsdp import CPUOffloadPolicy, FSDPModule, MixedPrecisionPolicy, OffloadPolicy, fully_shard
from torch.distributed.tensor import DTensor

from klguard.distributed.context import DistContext
from klguard.distributed.tensor_parallel import apply_tensor_parallel

# FSDP2 warns about every model output that is a view (HF heads return some); klguard never edits one in place
warnings.filterwarnings("ignore", message=r"FSDP2-wrapped module \(.*\) returned a view tensor")


def build_mesh(ctx: DistContext, fsdp_size: int) -> DeviceMesh:
    """1-D shard mesh over all ranks, or (world / fsdp_size) x fsdp_size for HSDP (fsdp_size = 1: DDP). With
    tensor parallelism: (dp_replicate, dp_shard, tp), dp_shard = fsdp_size (-1: all dp ranks)."""
    dp = ctx.dp_size
    shard = dp if fsdp_size <= 0 or fsdp_size >= dp else fsdp_size
    if ctx.tp_size > 1:
        return init_device_mesh(ctx.device.type, (dp // shard, shard, ctx.tp_size),
                                mesh_dim_names=("dp_replicate", "dp_shard", "tp"))
    if shard == dp:
        return init_device_mesh(ctx.device.type, (ctx.world_size,), mesh_dim_names=("fsdp",))
    return init_device_mesh(ctx.device.type, (dp // shard, shard), mesh_dim_names=("ddp", "fsdp"))


def data_parallel_mesh(mesh: DeviceMesh) -> DeviceMesh:
    """The dimensions FSDP2 shards (and, for HSDP, replicates) over: all but tp."""
    names = [n for n in mesh.mesh_dim_names if n != "tp"]
    if names == list(mesh.mesh_dim_names):
        return mesh
    return mesh[names[-1]] if mesh[names[0]].size() == 1 else mesh[tuple(names)]


def _layer_classes(model: torch.nn.Module) -> set[str]:
    names = set(getattr(model, "_no_split_modules", None) or [])
    if not names:
        raise ValueError(f"{type(model).__name__} names no decoder layer class (_no_split_modules) to shard by")
    return names


def shard_model(model: torch.nn.Module, ctx: DistContext, *, strategy: str, fsdp_size: int, offload: bool,
                reshard_after_forward: bool, param_dtype: torch.dtype | None, tp: int = 1,
                tp_key: str = "tensor_parallel_size") -> torch.nn.Module:
    """`model` sharded in place (one process: returned as it is, unless `ctx.one_rank_fsdp`): split over the
    mesh's tp ranks when `tp` > 1 (klguard.distributed.tensor_parallel; with `tp` = 1 in a tensor-parallel run it
    is replicated over them), then FSDP2 over the data-parallel ranks."""
    if not ctx.shards:
        return model
    mesh = build_mesh(ctx, 1 if strategy == "none" else fsdp_size)
    if tp > 1:
        apply_tensor_parallel(model, mesh["tp"], tp_key)
    policy = CPUOffloadPolicy() if offload and ctx.device.type == "cuda" else OffloadPolicy()
    mp = MixedPrecisionPolicy(param_dtype=param_dtype, reduce_dtype=torch.float32 if param_dtype else None)
    kwargs = dict(mesh=data_parallel_mesh(mesh), offload_policy=policy, mp_policy=mp)
    classes = _layer_classes(model)
    for module in model.modules():
        if type(module).__name__ in classes:
            fully_shard(module, reshard_after_forward=reshard_after_forward, **kwargs)
    # the root too, as verl: outside a forward the model then holds only its shards
    fully_shard(model, reshard_after_forward=reshard_after_forward, **kwargs)
    return model


def is_sharded(model: torch.nn.Module | None) -> bool:
    return isinstance(model, FSDPModule)


def local_numel(model: torch.nn.Module) -> int:
    """Parameter elements this rank stores (its shards; everything when unsharded)."""
    return sum((p.to_local() if isinstance(p, DTensor) else p).numel() for p in model.parameters())


@dataclass
class Resharding:
    """Seconds spent gathering and re-sharding weights around a generation (`unsharded` fills it)."""

    seconds: float = 0.0
    gathered: bool = False  # whether there were sharded weights to gather (or a replica to refresh)


@contextmanager
def unsharded(model: torch.nn.Module, reshard_after_forward: bool) -> Iterator[Resharding]:
    """Whole weights on every rank for generation (one all-gather per layer, none per token), sharded again
    after: the 3D-HybridEngine idea. Yields a Resharding that holds the all-gather's time, and the resharding's
    too once the block is left. Ranks may then run different numbers of forwards (generation stops early on
    some)."""
    measured = Resharding()
    modules = [m for m in model.modules() if isinstance(m, FSDPModule)]
    if not modules:
        yield measured
        return
    measured.gathered = True
    start = time.perf_counter()
    for module in modules:
        module.unshard()
        module.set_reshard_after_forward(False, recurse=False)
    measured.seconds += time.perf_counter() - start
    try:
        yield measured
    finally:
        start = time.perf_counter()
        for module in modules:
            module.reshard()
            module.set_reshard_after_forward(reshard_after_forward, recurse=False)
        measured.seconds += time.perf_counter() - start
