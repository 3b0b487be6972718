"""verl 0.9.1's keys: the `reward.*` block and the older spelling mean one thing, every 0.9.1 key loads."""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

import pytest
import yaml

from klguard.commands.cli import main
from klguard.config import load_config
from klguard.config.loader import _flatten, _schema_keys
from klguard.config.verl_keys import RENAMED, _read, verl_keys
from klguard.errors import ConfigError

# verl 0.9.1's reward block as its examples write it (examples/flowgrpo_trainer, reward loop README)
REWARD_BLOCK = [
    "reward.num_workers=4", "reward.reward_manager.name=naive", "reward.reward_model.enable=True",
    "reward.reward_model.model_path=/models/rm", "reward.reward_model.rollout.name=vllm",
    "reward.reward_model.rollout.tensor_model_parallel_size=4", "reward.reward_model.enable_resource_pool=True",
    "reward.custom_reward_function.path=my_reward.py", "reward.custom_reward_function.name=compute_score_ocr",
    "+reward.custom_reward_function.reward_kwargs.threshold=0.5",
]
OLDER = ["reward_model.enable=True", "reward_model.model.path=/models/rm", "custom_reward_function.path=my_reward.py",
         "custom_reward_function.name=compute_score_ocr", "+custom_reward_function.reward_kwargs.threshold=0.5"]


@pytest.fixture
def reward_file(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    Path("my_reward.py").write_text("def compute_score_ocr(*a, **k):\n    return 1.0\n")


def test_the_0_9_1_reward_block_means_the_older_keys(reward_file):
    new, old = load_config(None, REWARD_BLOCK), load_config(None, OLDER)
    assert new.config == old.config
    assert new.config.reward_model.enable is True and new.config.reward_model.model.path == "/models/rm"
    assert new.config.custom_reward_function.name == "compute_score_ocr"
    assert new.config.custom_reward_function.reward_kwargs == {"threshold": 0.5}
    assert new.ignored_verl_keys == ["reward.num_workers", "reward.reward_manager.name",
                                     "reward.reward_model.enable_resource_pool", "reward.reward_model.rollout.name",
                                     "reward.reward_model.rollout.tensor_model_parallel_size"]


def test_two_spellings_with_two_values_are_one_line_naming_both():
    with pytest.raises(ConfigError) as info:
        load_config(None, ["reward.reward_model.enable=true", "reward_model.enable=false"])
    assert str(info.value) == ("reward_model.enable=False and reward.reward_model.enable=True are one setting "
                               "(verl 0.9.1's and the older spelling): give it once")
    same = load_config(None, ["reward.reward_model.enable=false", "reward_model.enable=false"])
    assert same.config.reward_model.enable is False


def test_a_later_layer_wins_whatever_its_spelling(tmp_path):
    f = tmp_path / "c.yaml"
    f.write_text("reward:\n  reward_model:\n    enable: true\n    model_path: /m\n")
    assert load_config(f, ["reward_model.enable=false"]).config.reward_model.enable is False
    assert load_config(f).config.reward_model.model.path == "/m"


def test_0_9_1_nulls_on_the_older_keys_mean_not_set():
    loaded = load_config(None, ["reward_model.enable=null", "reward_model.model.trust_remote_code=null",
                                "custom_reward_function.name=null", "reward.reward_model.enable=true",
                                "reward.reward_model.model_path=/m"])
    assert loaded.config.reward_model.enable is True
    assert loaded.config.reward_model.model.trust_remote_code is False
    assert loaded.config.custom_reward_function.name == "compute_score"


def test_renamed_keys_are_0_9_1_keys_and_ours():
    ours, free_form = _schema_keys()
    release = _read("verl_0.9.1_keys.txt")
    for new, old in RENAMED.items():  # a key, or a section (critic.fsdp: every key under it)
        assert new in release or new.endswith("reward_kwargs") or any(k.startswith(new + ".") for k in release), new
        assert old in ours | free_form or any(k.startswith(old + ".") for k in ours), old  # reward_kwargs: see above


def test_0_9_1_critic_engine_keys_are_the_critic_fsdp_config():
    cfg = load_config(None, ["critic.fsdp.fsdp_size=2", "critic.fsdp.turbo_config.distributed.tensor_parallel_size=1",
                             "critic.fsdp.reshard_after_forward=false"]).config
    sharding = cfg.critic.model.fsdp_config
    assert (sharding.fsdp_size, sharding.reshard_after_forward) == (2, False)
    assert sharding.turbo_config.distributed.tensor_parallel_size == 1


def _verl_generated_yaml() -> Path | None:
    spec = importlib.util.find_spec("verl")
    if spec is None:
        if os.environ.get("CI") == "true":
            raise AssertionError("CI installs klguard[verl]; verl is missing")
        return None
    return Path(spec.origin).parent / "trainer" / "config" / "_generated_ppo_trainer.yaml"


def test_verl_0_9_1s_whole_generated_config_loads_and_every_key_is_known():
    path = _verl_generated_yaml()
    if path is None:
        pytest.skip("verl is not installed (pip install klguard[verl])")
    loaded = load_config(path)
    flat = {key for key, _ in _flatten(yaml.safe_load(path.read_text()))}
    ours, free_form = _schema_keys()
    unknown = {k for k in flat if k not in ours | free_form | verl_keys() and not k.startswith("hydra")}
    assert not unknown
    assert len(loaded.ignored_verl_keys) > 600  # most of verl 0.9.1 sizes GPUs, engines and Megatron
    assert loaded.config.algorithm.kl_ctrl.kl_coef == 0.001  # verl's defaults, read from verl's own file
    assert loaded.config.reward_model.enable is False


def test_the_warning_counts_the_keys(capsys):
    assert main(["train", "--print-config", *REWARD_BLOCK[:2]]) == 0
    warning = [line for line in capsys.readouterr().err.splitlines() if "warning" in line]
    assert warning == ["klguard: warning: 2 verl keys not applicable to klguard, ignored: reward.num_workers, "
                       "reward.reward_manager.name"]
