"""FSDP3D: tensor parallelism inside FSDP2 (strategy fsdp_turbo) against one process, on 2 and 4 gloo ranks.

TP=2 (dp=1) and dp=2 x tp=2 sample the same tokens as one process and sum the same gradients in another order,
so every logged metric agrees within float32 rounding (dist_runs.same_metrics, tests/tolerances.py); checkpoints
written under one layout resume under another; the guard's rollback under TP takes one process's decisions.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from dist_runs import TORCHRUN, TORCHRUN_4, TRAIN, cut_back, records, run, same_metrics, trained, why
from safetensors.torch import load_file

TP_KEY = "actor_rollout_ref.actor.fsdp_config.turbo_config.distributed.tensor_parallel_size"
TP2 = ["actor_rollout_ref.actor.strategy=fsdp_turbo", "critic.strategy=fsdp_turbo", f"{TP_KEY}=2"]


@pytest.fixture(scope="module")
def tp2(dist_base, tmp_path_factory) -> Path:
    return trained(TORCHRUN, [*dist_base, *TP2], tmp_path_factory.mktemp("tp2") / "run")


def _checks(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "rank_checks.jsonl").read_text().splitlines()]


def test_tp2_matches_one_process_on_every_metric(one_rank, tp2):
    worst = same_metrics(one_rank, tp2, range(1, 5), keys=())
    assert worst > 0  # the comparison ran on values that rounded differently: it is not comparing a run to itself
    checks = _checks(tp2)
    assert [c["step"] for c in checks] == [1, 2, 3, 4]
    for check in checks:
        assert (check["dp_rank"], check["tp_rank"]) == ([0, 0], [0, 1])
        assert check["kl_coef"][0] == check["kl_coef"][1]
        for held in check["actor_params"]:  # each tp rank holds half of every split weight, norms whole
            assert 0.45 < held / check["actor_params_total"] < 0.55
    assert 0 < records(tp2)[4]["perf/reshard_share"] < 1  # the rollout replica's weight gathering is timed


def test_generation_on_the_tp_shards_matches_one_process(one_rank, dist_base, tmp_path):
    shards = trained(TORCHRUN, [*dist_base, *TP2, "actor_rollout_ref.rollout.tensor_model_parallel_size=2",
                             "trainer.total_training_steps=2", "trainer.save_freq=-1"], tmp_path / "run")
    same_metrics(one_rank, shards, range(1, 3), keys=())


def test_dp2_tp2_on_four_ranks_matches_one_process(one_rank, dist_base, tmp_path):
    out = trained(TORCHRUN_4, [*dist_base, *TP2, "trainer.total_training_steps=3"], tmp_path / "run")
    same_metrics(one_rank, out, range(1, 4), keys=())
    for check in _checks(out):
        assert (check["dp_rank"], check["tp_rank"]) == ([0, 0, 1, 1], [0, 1, 0, 1])
        assert len(set(check["kl_coef"])) == 1
        for held in check["actor_params"]:  # a quarter each: split over tp, then sharded over dp
            assert 0.2 < held / check["actor_params_total"] < 0.3
    assert sorted(p.name for p in (out / "global_step_3" / "actor").glob("*.distcp")) == [
        f"__{r}_0.distcp" for r in range(4)]


@pytest.mark.parametrize(("source", "cmd", "layout"), [
    ("tp2", TRAIN, []),  # (dp=1, tp=2) -> one process
    ("tp2", TORCHRUN, []),  # (dp=1, tp=2) -> (dp=2, tp=1)
    ("one", TORCHRUN, TP2),  # and back: one process -> (dp=1, tp=2)
])
def test_a_checkpoint_resumes_under_another_layout(source, cmd, layout, one_rank, tp2, dist_base, tmp_path):
    resumed = cut_back(tp2 if source == "tp2" else one_rank, tmp_path / "run", 2)
    proc = run(cmd, [*dist_base, *layout], resumed)
    assert proc.returncode == 0, why(proc)
    assert "resumed from" in proc.stderr
    same_metrics(one_rank, resumed, range(3, 5))  # continues as the uninterrupted one-process run


def test_export_merges_the_tp_shards(tp2, tmp_path):
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

    from klguard.commands.cli import main

    assert main(["export", str(tp2 / "global_step_4"), str(tmp_path / "hf")]) == 0
    exported = load_file(tmp_path / "hf" / "model.safetensors")
    dcp_to_torch_save(tp2 / "global_step_4" / "actor", tmp_path / "torch.pt")  # torch's own reader of the shards
    merged = torch.load(tmp_path / "torch.pt", weights_only=True)["model"]
    assert exported.keys() == merged.keys()
    for name, tensor in merged.items():
        assert torch.equal(exported[name], tensor), name


def test_the_guard_rolls_back_under_tp_as_one_process_does(dist_base, tmp_path):
    """lr 0.003 drives the in-reward KL (~0.15 on step 2) far over guard.kl_hard_limit (0.1): a rollback to the
    initial policy, loaded into the tp-split actor, then training goes on with the tightened settings."""
    blow_up = [*dist_base, "actor_rollout_ref.actor.optim.lr=0.003", "trainer.total_training_steps=4"]
    one = trained(TRAIN, blow_up, tmp_path / "one")
    tp = trained(TORCHRUN, [*blow_up, *TP2], tmp_path / "tp")
    events = [[json.loads(line) for line in (out / "events.jsonl").read_text().splitlines()] for out in (one, tp)]
    assert any(e["kind"] == "rollback" for e in events[0])
    assert [(e["step"], e["kind"]) for e in events[1]] == [(e["step"], e["kind"]) for e in events[0]]
    same_metrics(one, tp, range(1, 5))


@pytest.mark.parametrize(("overrides", "world", "message"), [
    ([f"{TP_KEY}=2"], 2, f"{TP_KEY}=2 needs actor_rollout_ref.actor.strategy=fsdp_turbo (got fsdp2)"),
    ([*TP2], 3, f"{TP_KEY}=2 must divide the world size 3"),
    ([*TP2, "actor_rollout_ref.ref.fsdp_config.turbo_config.distributed.tensor_parallel_size=4"], 4,
     "actor_rollout_ref.ref.fsdp_config.turbo_config.distributed.tensor_parallel_size=4 must be the actor's "
     "tensor_parallel_size (2) or 1"),
    ([*TP2, "critic.strategy=fsdp2"], 2,
     "critic.model.fsdp_config.turbo_config.distributed.tensor_parallel_size=2 needs critic.strategy=fsdp_turbo"),
    ([*TP2, "actor_rollout_ref.rollout.tensor_model_parallel_size=4"], 2,
     "actor_rollout_ref.rollout.tensor_model_parallel_size=4 must be 1 (a whole copy per rank) or the actor's"),
    (["actor_rollout_ref.rollout.pipeline_model_parallel_size=2"], 2,
     "actor_rollout_ref.rollout.pipeline_model_parallel_size=2 must be 1: klguard has no pipeline parallelism"),
    ([*TP2, "data.train_batch_size=12", "actor_rollout_ref.actor.ppo_mini_batch_size=3"], 4,
     "actor_rollout_ref.actor.ppo_mini_batch_size=3 x rollout.n=1 = 3 rollouts does not split evenly over 2 "
     "data-parallel ranks (WORLD_SIZE 4 / tensor_parallel_size 2)"),
])
def test_bad_parallel_sizes_are_one_line_errors(overrides, world, message, monkeypatch, capsys, tmp_path):
    from klguard.commands.cli import main

    monkeypatch.setenv("WORLD_SIZE", str(world))  # as torchrun sets it; the checks run before any rendezvous
    assert main(["train", "algorithm.adv_estimator=gae", f"trainer.default_local_dir={tmp_path}", *overrides]) == 2
    lines = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith(f"klguard: error: {message}"), lines


def test_a_model_tp_cannot_split_is_refused_before_any_rendezvous(monkeypatch, capsys, tmp_path):
    from klguard.builtin.char_tokenizer import build_char_tokenizer
    from klguard.builtin.tiny import build_tiny_llama, save_hf_folder
    from klguard.commands.cli import main

    tok = build_char_tokenizer()
    folder = save_hf_folder(build_tiny_llama(tok, intermediate_size=255), tok, tmp_path / "odd-mlp")
    monkeypatch.setenv("WORLD_SIZE", "2")
    assert main(["train", *TP2, f"actor_rollout_ref.model.path={folder}", "algorithm.adv_estimator=grpo",
                 "actor_rollout_ref.rollout.n=2", f"trainer.default_local_dir={tmp_path / 'run'}"]) == 2
    lines = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert lines == [f"klguard: error: {TP_KEY}=2 must divide the model's intermediate_size=255"], lines
