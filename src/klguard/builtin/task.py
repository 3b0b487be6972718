"""The built-in tasks as the engine asks for them (klguard.ppo.task.BuiltinTask); the commands pass
`task_for(config)` in: `data.builtin_task` chooses arith (`TASK`, the toy), reviews (klguard.builtin.reviews) or
constraints (klguard.builtin.constraints), the last two on a real pretrained model."""

from __future__ import annotations

import importlib
from collections.abc import Callable
from pathlib import Path

from klguard.builtin.arith import write_arith_parquet
from klguard.builtin.learned_rm import ensure_learned_rm
from klguard.builtin.proxy import BuiltinReward
from klguard.builtin.warm_start import ensure_builtin_tokenizer, ensure_sft_policy
from klguard.config.schema import Config
from klguard.ppo.task import BuiltinTask


class ArithTask:
    """Arithmetic prompts, the shipped (or cached) SFT policy, the length-biased proxy and the learned RM."""

    def tokenizer_path(self, cfg: Config) -> Path:
        return ensure_builtin_tokenizer(cfg.sft)

    def policy_path(self, cfg: Config, *, log: Callable[[str], None]) -> Path:
        return ensure_sft_policy(cfg.sft, form=cfg.data.builtin_form, log=log)

    def write_data(self, cfg: Config, out_dir: Path) -> tuple[Path, Path]:
        data = cfg.data
        return write_arith_parquet(out_dir, data.builtin_train_size, data.builtin_val_size, cfg.trainer.seed,
                                   form=data.builtin_form)

    def learned_rm(self, cfg: Config, policy_path: Path, *, log: Callable[[str], None]) -> Path:
        return ensure_learned_rm(cfg.proxy_reward.learned_rm, cfg.sft, policy_path, form=cfg.data.builtin_form,
                                 max_new_tokens=cfg.data.max_response_length, log=log)

    def reward(self, cfg: Config) -> BuiltinReward:
        return BuiltinReward.of(cfg.proxy_reward)


TASK = ArithTask()
REAL_MODEL_TASKS = {"reviews": "klguard.builtin.reviews", "constraints": "klguard.builtin.constraints"}


def task_for(cfg: Config) -> BuiltinTask:
    """The built-in task `data.builtin_task` names (the real-model tasks imported only when chosen: they need the `real`
    extra)."""
    module = REAL_MODEL_TASKS.get(cfg.data.builtin_task)
    return TASK if module is None else importlib.import_module(module).TASK


def prepare_task(cfg: Config, log: Callable[[str], None]) -> None:
    """Build (or find cached) the built-in task's tokenizer and policy once, before child runs would race to: the
    arithmetic task's SFT policy, or SmolLM2's GGUF de-quantised for the reviews task."""
    if cfg.actor_rollout_ref.model.path.startswith("builtin://"):
        task = task_for(cfg)
        task.tokenizer_path(cfg)
        task.policy_path(cfg, log=log)
