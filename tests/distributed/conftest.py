"""Shared set-up for the distributed tests: 2-process CPU (gloo) runs of the built-in task under torchrun."""

from __future__ import annotations

from pathlib import Path

import pytest
from dist_runs import TRAIN, trained


@pytest.fixture(scope="session")
def dist_base(tmp_path_factory) -> list[str]:
    """A few-second run: tiny SFT, 16 prompts a step in mini-batches of 8 and micro-batches of 4 (a rank's share of
    a mini-batch is one micro-batch of the one-process run, so both sum the same gradients), adaptive KL."""
    cache = tmp_path_factory.mktemp("sft-cache")
    return [
        f"sft.cache_dir={cache}", "sft.steps=30", "sft.batch_size=64", "sft.eval_every=30",
        "trainer.progress_bar=false", "trainer.logger=[jsonl]", "trainer.val_before_train=false",
        "trainer.test_freq=-1", "trainer.save_freq=1", "trainer.total_training_steps=4", "trainer.debug=true",
        "data.builtin_train_size=64", "data.builtin_val_size=16", "data.train_batch_size=16",
        "data.max_response_length=16", "actor_rollout_ref.actor.ppo_mini_batch_size=8",
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=4", "critic.ppo_micro_batch_size_per_gpu=4",
        "algorithm.kl_ctrl.type=adaptive", "algorithm.kl_ctrl.horizon=50", "algorithm.kl_ctrl.kl_coef=0.2",
    ]


@pytest.fixture(scope="session")
def one_rank(dist_base, tmp_path_factory) -> Path:
    """The one-process run every multi-rank layout is compared with (4 steps, a checkpoint each)."""
    return trained(TRAIN, dist_base, tmp_path_factory.mktemp("one") / "run")
