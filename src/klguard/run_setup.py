"""Building blocks of a run: device, seeds, datasets, optimizers and schedules."""

from __future__ import annotations

import math
import random
from pathlib import Path

import numpy as np
import torch

from klguard.config.schema import Config, OptimConfig
from klguard.data.arith import write_arith_parquet
from klguard.data.dataset import load_rl_dataset


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name == "cuda" and not torch.cuda.is_available():
        from klguard.errors import ConfigError

        raise ConfigError("trainer.device=cuda but no CUDA device is available; use cpu or auto")
    return torch.device(name)


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def step_generator(seed: int, step: int, stream: int, device: torch.device) -> torch.Generator:
    """A generator derived from (seed, step, stream): rollouts are reproducible and resume-safe
    without carrying generator state, as nanochat derives its sampling seeds."""
    mixed = (seed * 0x9E3779B1 + step * 0x85EBCA77 + stream * 0xC2B2AE3D) % (2**63 - 1)
    return torch.Generator(device=device).manual_seed(mixed)


def build_datasets(config: Config, tokenizer, run_dir: Path):
    data = config.data
    train_files, val_files = data.train_files, data.val_files
    if train_files is None:  # the built-in arithmetic task, written as verl-format parquet
        train_files, val_files = (str(p) for p in write_arith_parquet(
            run_dir / "data", data.builtin_train_size, data.builtin_val_size, config.trainer.seed,
            form=data.builtin_form))
    kwargs = dict(prompt_key=data.prompt_key, max_prompt_length=data.max_prompt_length,
                  filter_overlong_prompts=data.filter_overlong_prompts, truncation=data.truncation,
                  apply_chat_template_kwargs=data.apply_chat_template_kwargs)
    train = load_rl_dataset(train_files, tokenizer, max_samples=data.train_max_samples, **kwargs)
    val = load_rl_dataset(val_files, tokenizer, max_samples=data.val_max_samples, **kwargs)
    return train, val


def build_optimizer(model: torch.nn.Module, cfg: OptimConfig, total_steps: int):
    """AdamW and a per-step schedule: linear warm-up, then constant or cosine (verl's options)."""
    params = [p for p in model.parameters() if p.requires_grad]
    optim = torch.optim.AdamW(params, lr=cfg.lr, betas=tuple(cfg.betas), weight_decay=cfg.weight_decay)
    warmup = cfg.lr_warmup_steps if cfg.lr_warmup_steps > 0 else int(cfg.lr_warmup_steps_ratio * total_steps)

    def factor(step: int) -> float:
        if step < warmup:
            return (step + 1) / warmup
        if cfg.lr_scheduler_type == "constant":
            return 1.0
        progress = (step - warmup) / max(1, total_steps - warmup)
        cosine = 0.5 * (1.0 + math.cos(math.pi * 2.0 * cfg.num_cycles * progress))
        return cfg.min_lr_ratio + (1.0 - cfg.min_lr_ratio) * max(0.0, cosine)

    return optim, torch.optim.lr_scheduler.LambdaLR(optim, factor)
