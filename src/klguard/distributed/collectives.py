"""Cross-rank reductions for what the KL controller, the guard and the logs read.

Per-row tensors are gathered whole (every rank then computes a statistic on the global batch, exactly as
one process would); per-micro-batch loss statistics are reduced as (sum, count) pairs, so a mean is
weighted by how many values each rank holds, never a mean of rank means. With one process each function
is the identity.
"""

from __future__ import annotations

import math

import torch
import torch.distributed as dist
from torch import Tensor

from klguard.distributed.context import data_parallel, is_distributed


def gather_objects(obj, group=None) -> list:
    """`obj` of every rank of `group` (default: the world), in rank order (one process: `[obj]`)."""
    if not is_distributed():
        return [obj]
    out: list = [None] * dist.get_world_size(group)
    dist.all_gather_object(out, obj, group=group)
    return out


def gather_rows(local: Tensor, index: Tensor | None = None) -> Tensor:
    """Concatenate every data-parallel rank's rows (dim 0); with `index` (each rank's global row numbers, see
    RowLayout) the result is put back in global order. Ranks may hold different numbers of rows. The tp ranks
    of a data-parallel group hold the same rows: each gathers from its own dp group, once."""
    if not is_distributed():
        return local
    parts = gather_objects(local.detach().cpu(), group=data_parallel()[0])
    rows = torch.cat(parts).to(local.device)
    if index is None:
        return rows
    out = torch.empty_like(rows)
    out[index.to(local.device)] = rows
    return out


def any_rank(flag: bool) -> bool:
    """True on every rank when `flag` is true on one."""
    if not is_distributed():
        return flag
    t = torch.tensor([1.0 if flag else 0.0])
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return bool(t.item() > 0)


def min_across_ranks(value: int) -> int:
    """The smallest `value` over ranks (e.g. the first of a list of names that any rank flags)."""
    if not is_distributed():
        return value
    t = torch.tensor([float(value)])
    dist.all_reduce(t, op=dist.ReduceOp.MIN)
    return int(t.item())


def reduce_means(acc: dict[str, list[float]]) -> dict[str, float]:
    """The mean of each key's values over all data-parallel ranks' lists, weighted by list length (tp ranks hold
    the same values: each dp group counts once)."""
    if not is_distributed():
        return {k: sum(v) / len(v) for k, v in acc.items() if v}
    totals: dict[str, list[float]] = {}
    sums = {k: (math.fsum(v), len(v)) for k, v in acc.items() if v}
    for part in gather_objects(sums, group=data_parallel()[0]):
        for key, (total, count) in part.items():
            entry = totals.setdefault(key, [0.0, 0])
            entry[0] += total
            entry[1] += count
    return {k: total / count for k, (total, count) in sorted(totals.items())}


def assert_same_across_ranks(values: dict[str, float], what: str) -> list[dict[str, float]]:
    """Debug check (trainer.debug): every rank holds exactly the same `values` (NaN equals NaN); returns
    every rank's values, in rank order."""
    parts = gather_objects({k: float(v) for k, v in values.items()})
    for rank, part in enumerate(parts[1:], start=1):
        if part.keys() != parts[0].keys():
            raise AssertionError(f"{what}: rank {rank} has keys {sorted(part.keys() ^ parts[0].keys())} rank 0 lacks "
                                 "or the reverse")
        for key, value in part.items():
            ref = parts[0][key]
            if not (value == ref or (math.isnan(value) and math.isnan(ref))):
                raise AssertionError(f"{what}: {key} is {ref!r} on rank 0 but {value!r} on rank {rank}")
    return parts
