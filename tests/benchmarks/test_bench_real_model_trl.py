"""benchmarks/real_model_trl.py's contenders and phase bookkeeping (the benchmark itself trains SmolLM2 in two
trainers for many minutes and is not run here)."""

from __future__ import annotations

import importlib.util
import json
import sys
from argparse import Namespace
from pathlib import Path

import pytest

from bench_scripts import import_scripts

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def bench():
    with import_scripts("real_model_trl", "real_model_speed_worker") as scripts:
        yield scripts


def _args(**kw) -> Namespace:
    return Namespace(**{"threads": 1, "seed": 1, "warmup": 1, "steps": 2, "trl_python": sys.executable, **kw})


@pytest.mark.parametrize("variant", ["fp32", "bf16", "lora"])
def test_klguard_runs_trls_grpo_step(bench, variant):
    """klguard's side: GRPO in groups of 8 over 8 prompts, 64 tokens always, TRL's KL (k3 loss, beta 0.001, none in
    the reward); bf16 by autocast; lora with TRL's adapters (r 16, alpha 32, every linear layer but the head)."""
    from klguard.config import load_config

    trl_bench, worker = bench
    (name, _, script, spec), (trl_name, _, trl_script, trl_spec) = trl_bench.specs(variant, _args(), Path("/p"))
    assert (name, script, trl_name, trl_script) == ("klguard", "real_model_speed_worker.py", "trl",
                                                    "real_model_trl_worker.py")
    with pytest.MonkeyPatch.context() as mp:  # the policy's path only: no GGUF needed to read the config
        mp.setattr("klguard.model.gguf.smollm2_path", lambda: Path("/smollm2"))
        cfg = load_config(overrides=worker.overrides(spec)).config
    assert cfg.actor_rollout_ref.rollout.n == trl_spec["n"] == 8
    assert cfg.data.train_batch_size == trl_spec["prompts"] == 8
    assert cfg.data.max_response_length == trl_spec["response_length"] == 64
    assert cfg.actor_rollout_ref.rollout.ignore_eos
    assert cfg.algorithm.adv_estimator == "grpo" and not cfg.algorithm.use_kl_in_reward
    actor = cfg.actor_rollout_ref.actor
    assert actor.use_kl_loss and actor.kl_loss_coef == trl_spec["kl_coef"] and actor.kl_loss_type == "low_var_kl"
    assert (actor.fsdp_config.dtype == "bfloat16") == (variant == "bf16")
    model = cfg.actor_rollout_ref.model
    assert (model.lora_rank, model.lora_alpha, model.target_modules) == (
        (16, 32, "all-linear") if variant == "lora" else (0, 16, "all-linear"))
    micro = trl_spec["micro_batch"]
    assert actor.ppo_micro_batch_size_per_gpu == cfg.actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu == micro
    assert (8 * 8) % micro == 0
    assert trl_spec["variant"] == variant


def test_phases_map_each_trainers_names(bench):
    trl_bench, _ = bench
    klguard_step = {"phases": {"gen": 3.0, "ref": 1.0, "reward": 0.1, "update_actor": 5.0, "update_critic": 2.0,
                               "values": 0.5, "step": 11.6}}
    assert trl_bench.phases_of(klguard_step, "klguard") == {"gen": 3.0, "old_logprob": 0.0, "ref": 1.0,
                                                           "values": 0.5, "reward": 0.1, "update": 7.0}
    trl_step = {"phases": {"gen": 4.0, "ref": 1.5, "update": 6.0}}
    assert trl_bench.phases_of(trl_step, "trl") == {"gen": 4.0, "old_logprob": 0.0, "ref": 1.5, "values": 0.0,
                                                   "reward": 0.0, "update": 6.0}


def test_the_docs_table_names_each_row_by_what_it_ran(bench, tmp_path, monkeypatch):
    """docs/gen_results.py's table of this benchmark's JSON: klguard's lora row by what it ran (results from before
    klguard had LoRA were its full fine-tune), TRL's trainer by variant, a failed variant in one row."""
    trl_bench, _ = bench
    spec = importlib.util.spec_from_file_location("gen_results", ROOT / "docs" / "gen_results.py")
    gen = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gen)
    contender = {"s_per_step": 2.0, "s_per_step_all": [2.0, 2.0], "warmup_s": [3.0], "peak_rss_mib": 100.0,
                 "phase_s": {p: 0.1 for p in trl_bench.PHASES}, "ready": {"trl": "1.16.0", "torch": "2.13.0"}}
    report = {"machine": {"cpu": "cpu", "cpu_count": 2, "threads_per_contender": 1, "bf16": {"cpu_flags": []}},
              "warmup": 1, "steps": 2, "elapsed_s": 60.0,
              "results": [{"variant": "lora", "trl_s_over_klguard_s": 1.5, "load_1min_per_round": [1.0],
                           "contenders": {"klguard": contender, "trl": contender}},
                          {"variant": "ppo", "trl_s_over_klguard_s": 1.2, "load_1min_per_round": [2.0],
                           "contenders": {"klguard": contender, "trl": contender}},
                          {"variant": "bf16", "error": "trl worker exited (code -9)\nmore"}]}
    (tmp_path / "r.json").write_text(json.dumps(report))
    monkeypatch.setattr(gen, "RESULTS", tmp_path)
    lines = gen.real_model_trl("r.json").splitlines()
    assert "klguard (full FT: no LoRA)" in lines[2] and "**1.50x**" in lines[2]
    assert "TRL 1.16.0 GRPOTrainer + LoRA" in lines[3] and "TRL 1.16.0 PPOTrainer |" in lines[5]
    assert "failed: trl worker exited (code -9)" in lines[6]
    assert len({line.count("|") for line in lines[:7]}) == 1  # every row has the header's columns
    assert "load average 1.0-2.0" in lines[-1]
    report["results"][0]["klguard_lora"] = True
    (tmp_path / "r.json").write_text(json.dumps(report))
    assert "| klguard + LoRA |" in gen.real_model_trl("r.json").splitlines()[2]


def test_ppo_runs_a_critic_and_a_reward_model_in_the_same_micro_batches_as_trl(bench, tmp_path):
    from klguard.config import load_config

    trl_bench, worker = bench
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(trl_bench, "reward_model_folder", lambda policy: tmp_path / "rm")
        mp.setattr(trl_bench, "WORK", tmp_path)
        (_, _, _, spec), (_, python, script, trl_spec) = trl_bench.specs(
            "ppo", _args(trl_ppo_python="/venv-trl/python"), Path("/p"))
        mp.setattr("klguard.model.gguf.smollm2_path", lambda: Path("/smollm2"))
        cfg = load_config(overrides=worker.overrides(spec)).config
    assert (python, script) == ("/venv-trl/python", "throughput_trl.py") and trl_spec["algo"] == "ppo"
    assert cfg.algorithm.adv_estimator == "gae" and cfg.actor_rollout_ref.rollout.n == 1
    assert cfg.data.train_batch_size == trl_spec["rollouts"] == 64
    assert cfg.reward_model.enable and cfg.reward_model.model.path == trl_spec["rm"] == str(tmp_path / "rm")
    micro = trl_spec["micro_batch"]
    assert cfg.critic.ppo_micro_batch_size_per_gpu == cfg.reward_model.micro_batch_size_per_gpu == micro
    assert cfg.actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu == micro
    assert cfg.data.max_response_length == trl_spec["response_length"] and cfg.actor_rollout_ref.rollout.ignore_eos
