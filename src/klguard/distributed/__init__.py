"""Data- and tensor-parallel training on torch.distributed: the process group and its (dp, tp) grid (context), FSDP2
sharding (fsdp), tensor parallelism inside it (tensor_parallel), which rollouts each rank holds (layout), cross-rank
reductions (collectives), gradient clipping across meshes (grad_clip) and sharded checkpoints (sharded_checkpoint).
One process runs the same code with every collective the identity."""

from klguard.distributed.collectives import (
    any_rank,
    assert_same_across_ranks,
    gather_objects,
    gather_rows,
    min_across_ranks,
    reduce_means,
)
from klguard.distributed.context import (
    DistContext,
    barrier,
    data_parallel,
    init_distributed,
    is_distributed,
    shutdown,
)
from klguard.distributed.layout import RowLayout, even_slice

__all__ = [
    "DistContext", "RowLayout", "any_rank", "assert_same_across_ranks", "barrier", "data_parallel", "even_slice",
    "gather_objects", "gather_rows", "init_distributed", "is_distributed", "min_across_ranks", "reduce_means",
    "shutdown",
]
