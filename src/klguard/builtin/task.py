"""The built-in task as the engine asks for it (klguard.ppo.task.BuiltinTask); the commands pass `TASK` in."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from klguard.builtin.arith import write_arith_parquet
from klguard.builtin.learned_rm import ensure_learned_rm
from klguard.builtin.proxy import BuiltinReward
from klguard.builtin.warm_start import ensure_builtin_tokenizer, ensure_sft_policy
from klguard.config.schema import Config


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
