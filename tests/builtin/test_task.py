"""The built-in task reaches the engine only as an argument: with it the default config runs, without it the
engine names the key that needed it."""

from __future__ import annotations

import pytest

from klguard.builtin.task import TASK
from klguard.config import load_config
from klguard.ppo.setup import build_datasets, build_rewards, resolve_learned_rm, resolve_tokenizer_path
from klguard.ppo.task import BuiltinTask
from klguard.reward.manager import RewardManager, TaskReward


def _public(protocol: type) -> set[str]:
    return {name for name in vars(protocol) if not name.startswith("_")}


def test_the_task_implements_what_the_engine_asks_for():
    assert _public(BuiltinTask) <= set(dir(TASK))
    assert _public(TaskReward) <= set(dir(TASK.reward(load_config(None, []).config)))


def test_without_the_task_the_engine_names_the_key_that_needs_it(tmp_path):
    cfg = load_config(None, [f"sft.cache_dir={tmp_path}"]).config
    with pytest.raises(ValueError, match=r"actor_rollout_ref\.model\.path=builtin://"):
        resolve_tokenizer_path(cfg, None)
    tokenizer = None  # never reached: the task is asked for first
    with pytest.raises(ValueError, match=r"data\.train_files=null"):
        build_datasets(cfg, tokenizer, tmp_path, None)
    with pytest.raises(ValueError, match="task_reward"):
        RewardManager(cfg, tokenizer)  # the proxy is on for the built-in task
    learned = load_config(None, ["proxy_reward.kind=learned_rm"]).config
    with pytest.raises(ValueError, match=r"proxy_reward\.kind=learned_rm"):
        resolve_learned_rm(learned, None, tmp_path)


def test_with_the_task_the_default_config_builds_its_data_and_rewards(tmp_path):
    from klguard.model.loading import load_tokenizer

    cfg = load_config(None, [f"sft.cache_dir={tmp_path / 'cache'}", "data.builtin_train_size=8",
                             "data.builtin_val_size=4"]).config
    tokenizer = load_tokenizer(resolve_tokenizer_path(cfg, TASK), cfg)
    train, val = build_datasets(cfg, tokenizer, tmp_path / "run", TASK)
    assert (len(train), len(val)) == (8, 4)
    assert (tmp_path / "run" / "data" / "train.parquet").is_file()
    out = build_rewards(cfg, tokenizer, TASK, None)(["#### 1", "#### 2 Q:1+1-1=?A:#### 1"], [7, 26],
                                                    ["klguard/arith"] * 2, ["2", "2"], [{}, {}])
    assert out.gold.tolist() == [0.0, 0.0] and out.hacked.tolist() == [False, True]
