"""LoRA on the actor (`actor_rollout_ref.model.lora_rank`): only the adapters train, a checkpoint resumes to the
uninterrupted run, a re-anchored reference and `klguard export` take the merged weights, and bad settings are one
line."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM

from klguard.commands.cli import main
from klguard.config import load_config
from klguard.distributed.sharded_checkpoint import copy_weights
from klguard.errors import UserError
from klguard.model.loading import load_policy
from klguard.model.lora import LORA_CONFIG_KEY, merged_state_dict, saved_lora
from tolerances import float32_tol, forward_terms

LORA = ["actor_rollout_ref.model.lora_rank=4", "actor_rollout_ref.model.lora_alpha=8",
        "actor_rollout_ref.actor.optim.lr=1e-2"]
CPU = torch.device("cpu")


def _records(run: Path) -> dict[int, dict]:
    lines = (run / "metrics.jsonl").read_text().splitlines()
    return {r["step"]: r for r in map(json.loads, lines) if "actor/pg_loss" in r}


def test_only_the_adapters_train_and_export_writes_the_merged_model(base_overrides, assets, tmp_path):
    # with activation checkpointing: the frozen embeddings must not cut the adapters off from the gradient
    assert main(["train", *base_overrides, *LORA, "actor_rollout_ref.model.enable_gradient_checkpointing=true"]) == 0
    actor = tmp_path / "run" / "global_step_3" / "actor"
    saved = load_file(actor / "model.safetensors")
    initial = load_file(assets.policy / "model.safetensors")
    adapted = {k.replace(".base_layer", "") for k in saved if ".base_layer." in k}
    assert adapted and adapted <= set(initial)
    for key, value in saved.items():  # the base weights are the initial policy's, bit for bit
        if ".lora_" not in key:
            assert torch.equal(value, initial[key.replace(".base_layer", "")]), key
    assert any(saved[k].abs().sum() > 0 for k in saved if ".lora_B." in k)  # the adapters moved (B starts at 0)
    assert json.loads((actor / "config.json").read_text())[LORA_CONFIG_KEY]["r"] == 4

    out = tmp_path / "export"
    assert main(["export", str(tmp_path / "run"), str(out)]) == 0
    plain = AutoModelForCausalLM.from_pretrained(out)
    assert LORA_CONFIG_KEY not in json.loads((out / "config.json").read_text())
    assert not any("lora" in k or "base_layer" in k for k in plain.state_dict())
    cfg = load_config(None, [*base_overrides, *LORA]).config
    lora = load_policy(actor, cfg, trainable=True, device=CPU)  # resumes with its adapters
    assert saved_lora(lora.config) is not None and any(p.requires_grad for p in lora.parameters())
    ids = torch.tensor([[5, 17, 42, 8, 99, 3]])
    with torch.no_grad():
        want, got = lora(ids).logits, plain(ids).logits
    assert (got - want).abs().max() <= float32_tol(want, forward_terms(plain))
    assert main(["export", str(tmp_path / "run"), str(tmp_path / "export-bf16"), "--dtype", "bfloat16"]) == 0


def test_a_resumed_lora_run_equals_the_uninterrupted_one(base_overrides, assets, tmp_path):
    args = [*base_overrides, *LORA, "trainer.total_training_steps=3", "trainer.save_freq=2"]
    straight = tmp_path / "run"
    assert main(["train", *args]) == 0
    shutil.copytree(straight / "global_step_2", tmp_path / "ckpt")
    resumed = tmp_path / "resumed"
    assert main(["train", *args, f"trainer.default_local_dir={resumed}", "trainer.resume_mode=resume_path",
                 f"trainer.resume_from_path={tmp_path / 'ckpt'}"]) == 0
    want, got = _records(straight)[3], _records(resumed)[3]
    for key in ("actor/pg_loss", "actor/grad_norm", "critic/score/mean"):
        assert got[key] == pytest.approx(want[key], abs=float32_tol(want[key], 1024)), key


def test_a_reanchored_reference_takes_the_merged_weights(base_overrides, assets):
    cfg = load_config(None, [*base_overrides, *LORA]).config
    actor = load_policy(assets.policy, cfg, trainable=True, device=CPU)
    with torch.no_grad():
        for name, param in actor.named_parameters():
            if ".lora_B." in name:
                param.normal_(0, 0.05)
    ref = load_policy(assets.policy, cfg, trainable=False, device=CPU)
    settings = saved_lora(actor.config)
    copy_weights(actor, ref, convert=lambda state: merged_state_dict(state, settings))
    ids = torch.tensor([[5, 17, 42, 8, 99, 3]])
    with torch.no_grad():
        want, got = actor(ids).logits, ref(ids).logits
    assert (want - ref.__class__.from_pretrained(assets.policy)(ids).logits).abs().max() > 1e-3  # it moved
    assert (got - want).abs().max() <= float32_tol(want, forward_terms(ref))


def test_bad_lora_settings_are_one_line(base_overrides, assets, capsys):
    cfg = load_config(None, [*base_overrides, *LORA, "actor_rollout_ref.model.target_modules=[no_such_proj]"]).config
    with pytest.raises(UserError, match=r"^actor_rollout_ref\.model\.target_modules=\['no_such_proj'\] matched no "):
        load_policy(assets.policy, cfg, trainable=True, device=CPU)
    assert main(["train", *base_overrides, "actor_rollout_ref.model.lora_rank=-1"]) == 2
    assert main(["train", *base_overrides, *LORA, "algorithm.adv_estimator=grpo", "actor_rollout_ref.rollout.n=2",
                 "actor_rollout_ref.actor.strategy=fsdp_turbo",
                 "actor_rollout_ref.actor.fsdp_config.turbo_config.distributed.tensor_parallel_size=2"]) == 2
    errors = [line for line in capsys.readouterr().err.splitlines() if "error" in line]
    assert "actor_rollout_ref.model.lora_rank=-1" in errors[0]
    assert "actor_rollout_ref.model.lora_rank=4 is not supported with tensor parallelism" in errors[1]
