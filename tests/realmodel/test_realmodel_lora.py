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
from klguard.ppo.trainer import PPOTrainer
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


def _moved_adapters(model: torch.nn.Module) -> None:
    with torch.no_grad():
        for name, param in model.named_parameters():
            if ".lora_B." in name:
                param.normal_(0, 0.05)


def test_the_lora_reference_is_the_actors_base_until_a_reanchor_gives_it_a_model(base_overrides, assets):
    # verl and TRL compute a LoRA run's reference with the adapters off: no second copy of the model
    cfg = load_config(None, [*base_overrides, *LORA, "algorithm.use_kl_in_reward=true"]).config
    trainer = PPOTrainer(cfg, log=lambda msg: None)
    state = trainer.state
    assert state.ref is None and state.ref_in_actor and state.has_reference
    _moved_adapters(state.actor)
    plain = AutoModelForCausalLM.from_pretrained(assets.policy)
    ids = torch.tensor([[5, 17, 42, 8, 99, 3]])
    with torch.no_grad():
        adapted = state.actor(ids).logits
        with state.reference() as ref:
            base = ref(ids).logits
            assert not ref.training
        again = state.actor(ids).logits
    want = plain(ids).logits
    assert (base - want).abs().max() <= float32_tol(want, forward_terms(plain))  # the initial policy
    assert (adapted - want).abs().max() > 1e-3 and torch.equal(again, adapted)  # adapters back on after the block
    assert state.actor.training and any(p.requires_grad for n, p in state.actor.named_parameters() if ".lora_" in n)

    trainer.guard.reanchor_reference(3)  # the reference becomes the adapted policy: a merged model of its own
    assert state.ref is not None and not state.ref_in_actor
    with torch.no_grad(), state.reference() as ref:
        got = ref(ids).logits
    assert ref is state.ref and (got - adapted).abs().max() <= float32_tol(adapted, forward_terms(plain))


def test_a_lora_run_with_kl_in_the_reward_trains_against_its_base(base_overrides, assets, tmp_path):
    args = [*base_overrides, *LORA, "algorithm.use_kl_in_reward=true", "algorithm.kl_ctrl.kl_coef=0.1",
            "algorithm.kl_penalty=mse"]  # k2: zero only where the two log-probs are equal
    assert main(["train", *args]) == 0
    records = _records(tmp_path / "run")
    kls = [records[s]["actor/reward_kl_penalty"] for s in (1, 2, 3)]
    # step 1: the adapters (B = 0) leave the policy its base; then it moves off it (a reference that kept the
    # adapters on would be the policy itself, its KL float noise at every step)
    assert kls[0] <= 1e-9 and kls[2] > 1e-6
    assert not (tmp_path / "run" / "global_step_3" / "ref").exists()
