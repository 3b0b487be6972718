"""`klguard eval CHECKPOINT`: gold score and hacking rate of a saved policy on the validation split.

CHECKPOINT is a run directory (its latest checkpoint), a `global_step_N/` folder (HF or sharded DCP layout, as
`klguard export` reads them) or a plain HF model folder."""

from __future__ import annotations

import tempfile
from pathlib import Path

from klguard.builtin.task import task_for
from klguard.commands.export import find_policy, load_policy_for_export
from klguard.config import Config
from klguard.distributed.context import resolve_device
from klguard.model.loading import apply_precision, load_policy, load_tokenizer
from klguard.ppo.scoring import validate_policy
from klguard.ppo.setup import build_datasets, build_rewards, resolve_learned_rm
from klguard.runtime.seeding import seed_everything


def evaluate_checkpoint(config: Config, checkpoint: str | Path) -> dict[str, float]:
    seed_everything(config.trainer.seed)
    task = task_for(config)
    source = find_policy(checkpoint)
    device = resolve_device(config.trainer.device)
    tokenizer = load_tokenizer(source.meta, config)
    with tempfile.TemporaryDirectory(prefix="klguard-eval-") as scratch:  # the built-in task's parquet
        _, val_data = build_datasets(config, tokenizer, Path(scratch), task)
    if source.layout == "dcp":  # a sharded checkpoint: its shards merged on this one process
        model = load_policy_for_export(source).to(device).eval().requires_grad_(False)
        model = apply_precision(model, config.actor_rollout_ref.actor.fsdp_config.dtype, device)
    else:
        model = load_policy(source.weights, config, trainable=False, device=device)
    learned_rm = resolve_learned_rm(config, task)  # the run's proxy, fit to its SFT policy
    rewards = build_rewards(config, tokenizer, task, learned_rm)
    return validate_policy(model, tokenizer, rewards, val_data, config, device)
