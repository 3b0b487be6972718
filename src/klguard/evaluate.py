"""`klguard eval CHECKPOINT`: gold score and hacking rate of a saved policy on the validation split."""

from __future__ import annotations

import tempfile
from pathlib import Path

from klguard.config import Config
from klguard.model.loading import check_model_folder, load_policy, load_tokenizer
from klguard.reward.manager import RewardManager
from klguard.run_setup import build_datasets, resolve_device, seed_everything
from klguard.validation import validate_policy


def policy_folder(checkpoint: str | Path) -> Path:
    """A `global_step_N/` checkpoint (its `actor/` folder) or a plain HF model folder."""
    path = Path(checkpoint).expanduser()
    if (path / "actor" / "config.json").is_file():
        return path / "actor"
    return check_model_folder(path, "CHECKPOINT")


def evaluate_checkpoint(config: Config, checkpoint: str | Path) -> dict[str, float]:
    seed_everything(config.trainer.seed)
    folder = policy_folder(checkpoint)
    device = resolve_device(config.trainer.device)
    tokenizer = load_tokenizer(folder, config)
    with tempfile.TemporaryDirectory(prefix="klguard-eval-") as scratch:  # the built-in task's parquet
        _, val_data = build_datasets(config, tokenizer, Path(scratch))
    model = load_policy(folder, config, trainable=False, device=device)
    return validate_policy(model, tokenizer, RewardManager(config, tokenizer), val_data, config, device)
