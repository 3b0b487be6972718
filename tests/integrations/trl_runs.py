"""Tiny GRPOTrainer runs on the built-in task (the shipped 0.33M-parameter policy, CPU, nothing downloaded)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

if os.environ.get("CI") == "true":  # CI installs klguard[trl]: a missing TRL is a failure there, not a skip
    import trl  # noqa: F401
else:
    pytest.importorskip("trl")

from transformers import AutoModelForCausalLM, AutoTokenizer
from trl import GRPOConfig, GRPOTrainer

from klguard.builtin.trl_task import builtin_policy, builtin_prompts, gold, hacking, proxy
from klguard.integrations.trl import KLGuardCallback


def grpo_trainer(out: Path, *, steps: int, seed: int = 1, **config) -> GRPOTrainer:
    folder = builtin_policy()
    tokenizer = AutoTokenizer.from_pretrained(folder)
    model = AutoModelForCausalLM.from_pretrained(folder)
    settings = {"per_device_train_batch_size": 8, "num_generations": 4, "max_completion_length": 24,
                "learning_rate": 1e-4, "beta": 0.001, "max_steps": steps, "logging_steps": 1, "save_steps": 1000,
                "report_to": [], "reward_weights": [1.0, 0.0, 0.0], "temperature": 1.0, "use_cpu": True,
                "seed": seed, "disable_tqdm": True, "log_level": "error", "save_total_limit": None,
                "bf16": False, "gradient_checkpointing": False} | config  # TRL turns both on: ~10x slower on a CPU
    args = GRPOConfig(output_dir=str(out), **settings)
    return GRPOTrainer(model=model, reward_funcs=[proxy, gold, hacking], args=args,
                       train_dataset=builtin_prompts(tokenizer, 256, seed=seed), processing_class=tokenizer)


def guarded(trainer: GRPOTrainer, overrides=()) -> KLGuardCallback:
    callback = KLGuardCallback(trainer, [*overrides])
    trainer.add_callback(callback)
    return callback


def inject(callback: KLGuardCallback, at: dict[int, dict[str, float]]) -> None:
    """Replace logged metrics at chosen steps just before the guard reads them (a forced blow-up)."""
    original = callback.on_log

    def on_log(args, state, control, logs=None, **kwargs):
        if logs is not None and "loss" in logs:
            logs.update(at.get(state.global_step, {}))
        return original(args, state, control, logs=logs, **kwargs)

    callback.on_log = on_log


def snapshot_after_guard(callback: KLGuardCallback, step: int) -> dict:
    """Copies of the trainer's weights, reference, optimizer state, lrs and rollout buffer right after the guard
    acted on step ``step``'s log (filled in during training)."""
    trainer, seen, original = callback.trainer, {}, callback.on_log

    def on_log(args, state, control, logs=None, **kwargs):
        out = original(args, state, control, logs=logs, **kwargs)
        if state.global_step == step and logs is not None and "loss" in logs:
            seen["model"] = {k: v.clone() for k, v in trainer.model.state_dict().items()}
            seen["ref"] = {k: v.clone() for k, v in trainer.ref_model.state_dict().items()}
            moments = trainer.optimizer.state_dict()["state"]  # cloned: the next steps update them in place
            seen["optim"] = {i: {k: v.clone() for k, v in m.items()} for i, m in moments.items()}
            seen["lr"] = [g["lr"] for g in trainer.optimizer.param_groups]
            seen["buffer"] = trainer._buffered_inputs
        return out

    callback.on_log = on_log
    return seen


def train_logs(trainer: GRPOTrainer) -> dict[int, dict]:
    """The training steps' log entries (as trainer_state.json holds them), by step."""
    return {row["step"]: row for row in trainer.state.log_history if "loss" in row}
