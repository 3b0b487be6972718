"""What the engine asks of the built-in task, which it never imports: klguard.builtin implements `BuiltinTask`, and
the caller (the commands) passes it to `PPOTrainer` and to the setup functions that need it.

The engine reaches for it only where the config names it: the policy path `builtin://...` (its tokenizer and SFT
policy), no `data.train_files` (its arithmetic data), a proxy reward or `proxy_reward.kind=learned_rm` (its scoring,
klguard.reward.manager.TaskReward). A run of a user's model, data and reward model needs no task at all.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Protocol

from klguard.config.schema import Config
from klguard.reward.manager import TaskReward


class BuiltinTask(Protocol):
    def tokenizer_path(self, cfg: Config) -> Path:
        """A saved copy of the task's tokenizer, available before (and without) its SFT policy."""
        ...

    def policy_path(self, cfg: Config, *, log: Callable[[str], None]) -> Path:
        """The SFT policy of the run's recipe (`cfg.sft`, `data.builtin_form`): shipped, cached or trained now."""
        ...

    def write_data(self, cfg: Config, out_dir: Path) -> tuple[Path, Path]:
        """Write the task's train and validation parquet files under `out_dir`; returns their paths."""
        ...

    def learned_rm(self, cfg: Config, policy_path: Path, *, log: Callable[[str], None]) -> Path:
        """The learned reward model's folder, fit to `policy_path`'s samples unless cached."""
        ...

    def reward(self, cfg: Config) -> TaskReward:
        """The task's proxy and hacking yardstick, weighted as `cfg.proxy_reward` says."""
        ...


def require_task(task: BuiltinTask | None, what: str) -> BuiltinTask:
    """`task`, or a ValueError saying that `what` needs one (a programming error: the commands always pass it)."""
    if task is None:
        raise ValueError(f"{what} needs the built-in task: pass task=klguard.builtin.task.TASK")
    return task
