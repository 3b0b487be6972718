"""The pieces of data parallelism without torchrun: row layout, world-size checks, reductions over 2 gloo ranks."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from klguard.commands.cli import main
from klguard.distributed import gather_rows, reduce_means
from klguard.distributed.layout import RowLayout, even_slice, rank_rows


def test_every_mini_batch_is_split_evenly_over_the_ranks():
    ranks = [rank_rows(16, 8, 2, r).tolist() for r in range(2)]
    assert ranks == [[0, 1, 2, 3, 8, 9, 10, 11], [4, 5, 6, 7, 12, 13, 14, 15]]
    assert rank_rows(12, 12, 1, 0).tolist() == list(range(12))
    assert sorted(torch.cat([rank_rows(24, 6, 3, r) for r in range(3)]).tolist()) == list(range(24))
    with pytest.raises(ValueError):
        rank_rows(16, 6, 2, 0)
    assert [even_slice(5, r, 3) for r in range(3)] == [slice(0, 2), slice(2, 4), slice(4, 5)]
    one = RowLayout(8, 4, 0, 1)
    x = torch.arange(8)
    assert one.local(x) is x and one.gather(x) is x and one.sample_rows(x.device) is None


@pytest.mark.parametrize(("overrides", "message"), [
    (["data.train_batch_size=12", "actor_rollout_ref.actor.ppo_mini_batch_size=3"],
     "actor_rollout_ref.actor.ppo_mini_batch_size=3 x rollout.n=1 = 3 rollouts does not split evenly over 2 ranks"),
    (["actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=8"],
     "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=8 must divide the per-rank mini-batch of 4 rollouts"),
    (["critic.model.fsdp_config.fsdp_size=3"], "critic.model.fsdp_config.fsdp_size=3 must divide the world size 2"),
])
def test_batches_that_do_not_split_over_the_ranks_are_refused(overrides, message, monkeypatch, capsys, tmp_path):
    monkeypatch.setenv("WORLD_SIZE", "2")  # as torchrun sets it; the check runs before any rendezvous
    args = ["train", "data.train_batch_size=24", "actor_rollout_ref.actor.ppo_mini_batch_size=8",
            f"trainer.default_local_dir={tmp_path}", *overrides]
    assert main(args) == 2
    lines = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith(f"klguard: error: {message}")


def _worker(rank: int, init: str, out) -> None:
    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=2)
    try:
        # rank 0 holds three values, rank 1 one: the mean of all four, not the mean of the two rank means
        acc = {"kl": [1.0, 2.0, 3.0]} if rank == 0 else {"kl": [10.0]}
        rows = gather_rows(torch.tensor([[rank * 1.0], [rank + 0.5]]), torch.tensor([0, 2, 1, 3]))
        out.put((rank, reduce_means(acc)["kl"], rows.flatten().tolist()))
    finally:
        dist.destroy_process_group()


def test_reductions_weight_by_count_and_gathers_keep_global_order(tmp_path):
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    procs = [ctx.Process(target=_worker, args=(r, f"file://{tmp_path / 'store'}", queue)) for r in range(2)]
    for proc in procs:
        proc.start()
    results = sorted(queue.get(timeout=60) for _ in procs)
    for proc in procs:
        proc.join(timeout=30)
    assert [r[1] for r in results] == [4.0, 4.0]
    assert results[0][2] == results[1][2] == [0.0, 1.0, 0.5, 1.5]
