"""The process group of a run: torchrun's environment (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR...) or
one process. Both go through the same code: with one process every collective is the identity.

Backend from the device: gloo on CPU, nccl on CUDA (each rank on `cuda:LOCAL_RANK`). A collective
that waits longer than `trainer.dist_timeout_s` raises instead of hanging; torchrun stops the other
ranks as soon as one exits with an error.

With tensor parallelism (`tp_size` > 1) the ranks form a (dp, tp) grid, tp ranks adjacent: rank = dp_rank * tp_size
+ tp_rank. The tp ranks of one dp group hold the same rows, so rows are split, gathered and reduced over the
data-parallel group only (`data_parallel()`).

Test hook: `KLGUARD_TEST_RAISE_ON_RANK=R:S` raises a RuntimeError on rank R at the start of step S+1,
to test that one failing rank brings the whole job down. It does nothing when unset.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from datetime import timedelta

import torch
import torch.distributed as dist

from klguard.errors import ConfigError

RAISE_ON_RANK_ENV = "KLGUARD_TEST_RAISE_ON_RANK"


_DATA_PARALLEL: dict = {"group": None}  # the process group rows are split over (None: the world)


@dataclass
class DistContext:
    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    device: torch.device = field(default_factory=lambda: torch.device("cpu"))
    tp_size: int = 1
    one_rank_fsdp: bool = False  # one process with FSDP2 on a one-rank mesh (for CPU offload on one GPU)

    @property
    def shards(self) -> bool:
        """Models go through FSDP2: several ranks, or one rank that asked for it."""
        return self.distributed or self.one_rank_fsdp

    @property
    def dp_rank(self) -> int:
        return self.rank // self.tp_size

    @property
    def dp_size(self) -> int:
        return self.world_size // self.tp_size

    @property
    def tp_rank(self) -> int:
        return self.rank % self.tp_size

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def distributed(self) -> bool:
        return self.world_size > 1

    def barrier(self) -> None:
        if self.distributed:
            dist.barrier()

    def main_first(self, fn, *args, **kwargs):
        """`fn` on rank 0, then on the others (rank 0 fills a cache or writes a file the others read)."""
        if self.is_main:
            result = fn(*args, **kwargs)
            self.barrier()
            return result
        self.barrier()
        return fn(*args, **kwargs)

    def maybe_inject_failure(self, step: int) -> None:
        """The test hook of the module docstring."""
        spec = os.environ.get(RAISE_ON_RANK_ENV)
        if spec and spec == f"{self.rank}:{step}":
            raise RuntimeError(f"injected failure on rank {self.rank} at step {step + 1} ({RAISE_ON_RANK_ENV})")


def world_size_from_env() -> int:
    return int(os.environ.get("WORLD_SIZE", "1"))


def resolve_device(name: str) -> torch.device:
    """`trainer.device`: auto (CUDA when there is one), cpu or cuda."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name == "cuda" and not torch.cuda.is_available():
        raise ConfigError("trainer.device=cuda but no CUDA device is available; use cpu or auto")
    return torch.device(name)


def _resolve_device(name: str, local_rank: int) -> torch.device:
    device = resolve_device(name)
    if device.type == "cuda":
        if local_rank >= torch.cuda.device_count():
            raise ConfigError(f"trainer.device={name}: LOCAL_RANK={local_rank} but only {torch.cuda.device_count()} "
                              "CUDA devices are visible; lower --nproc_per_node")
        device = torch.device("cuda", local_rank)
        torch.cuda.set_device(device)
    return device


def init_distributed(device_name: str, timeout_s: float = 1800.0, tp_size: int = 1,
                     one_rank_fsdp: bool = False) -> DistContext:
    """Join torchrun's process group (or stay one process), pick this rank's device and, with `tp_size` > 1,
    make the data-parallel groups (ranks with the same tp_rank). `one_rank_fsdp`: one process still gets a
    (one-rank) process group, so that FSDP2 and its CPU offload can wrap the models."""
    world = world_size_from_env()
    rank, local_rank = int(os.environ.get("RANK", "0")), int(os.environ.get("LOCAL_RANK", "0"))
    device = _resolve_device(device_name, local_rank)
    backend = "nccl" if device.type == "cuda" else "gloo"
    if world > 1 and not dist.is_initialized():
        dist.init_process_group(backend, timeout=timedelta(seconds=timeout_s),
                                device_id=device if device.type == "cuda" else None)
    elif one_rank_fsdp and not dist.is_initialized():  # no torchrun needed: an in-memory store for one rank
        dist.init_process_group(backend, store=dist.HashStore(), rank=0, world_size=1,
                                timeout=timedelta(seconds=timeout_s))
    if dist.is_initialized():
        rank, world = dist.get_rank(), dist.get_world_size()
    ctx = DistContext(rank=rank, world_size=world, local_rank=local_rank, device=device, tp_size=tp_size,
                      one_rank_fsdp=one_rank_fsdp and world == 1)
    if tp_size > 1:
        from torch.distributed.device_mesh import init_device_mesh

        mesh = init_device_mesh(device.type, (ctx.dp_size, tp_size), mesh_dim_names=("dp", "tp"))
        _DATA_PARALLEL["group"] = mesh["dp"].get_group()
    return ctx


def data_parallel() -> tuple[object | None, int, int]:
    """(group, rank, size) of the data-parallel ranks: the world unless tensor parallelism is on."""
    group = _DATA_PARALLEL["group"]
    if not is_distributed():
        return None, 0, 1
    return group, dist.get_rank(group), dist.get_world_size(group)


def barrier() -> None:
    """Wait for every rank (a no-op for one process)."""
    if is_distributed():
        dist.barrier()


def shutdown() -> None:
    """Leave the process group (a no-op for one process)."""
    _DATA_PARALLEL["group"] = None
    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()


def is_distributed() -> bool:
    return dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1
