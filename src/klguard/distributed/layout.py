"""Which rollouts each data-parallel rank holds.

Every mini-batch (`block` consecutive rollouts of the global batch) is split evenly across the ranks, so an
optimizer step at W ranks sees the same rollouts as at one rank and the averaged gradient is the same.
Rows of a step live on their rank for the forwards (generation, reference, values, updates); the per-row
results the KL controller, the advantages, the rewards and the metrics need are gathered into the global
batch, in global order, on every rank.
"""

from __future__ import annotations

import torch
from torch import Tensor

from klguard.distributed.collectives import gather_rows


def rank_rows(total: int, block: int, world: int, rank: int) -> Tensor:
    """Global row numbers of `rank`: its 1/world share of every block of `block` consecutive rows."""
    if total % block or block % world:
        raise ValueError(f"{total} rows in blocks of {block} cannot be split evenly over {world} ranks")
    per = block // world
    starts = torch.arange(0, total, block)
    return (starts[:, None] + rank * per + torch.arange(per)).reshape(-1)


class RowLayout:
    """This rank's rows of one step: `local(t)` selects them, `gather(t)` rebuilds the global batch."""

    def __init__(self, total: int, block: int, rank: int, world: int) -> None:
        self.world = world
        self.total = total
        self.index = rank_rows(total, block, world, rank)
        self.order = torch.cat([rank_rows(total, block, world, r) for r in range(world)])

    def local(self, tensor: Tensor) -> Tensor:
        return tensor if self.world == 1 else tensor[self.index.to(tensor.device)]

    def gather(self, tensor: Tensor) -> Tensor:
        return tensor if self.world == 1 else gather_rows(tensor, self.order)

    def sample_rows(self, device: torch.device) -> tuple[Tensor, int] | None:
        """For `generate`: each row draws the uniform it would draw in the global batch."""
        return None if self.world == 1 else (self.index.to(device), self.total)


def even_slice(n: int, rank: int, world: int) -> slice:
    """Contiguous share of `n` rows for `rank` (sizes differ by at most one; validation)."""
    base, extra = divmod(n, world)
    start = rank * base + min(rank, extra)
    return slice(start, start + base + (rank < extra))
