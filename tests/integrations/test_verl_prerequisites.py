"""What the verl plugin says at start about a run's settings: one line for each thing the guard cannot do with them
(no checkpoints, no KL to the reference, no validation), naming the verl key to add; none where the run has them."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from klguard.integrations.verl.prerequisites import missing_prerequisites

READY = {"trainer": {"save_freq": 10, "test_freq": 5}, "algorithm": {"use_kl_in_reward": True}}


def test_verl_defaults_give_one_line_each():
    lines = missing_prerequisites({})  # every key absent: verl's defaults
    assert len(lines) == 3 and all("\n" not in line and line.startswith("klguard: ") for line in lines)
    checkpoints, kl, validation = lines
    assert "trainer.save_freq=-1" in checkpoints and "rollback becomes a pause" in checkpoints
    assert "add trainer.save_freq=10" in checkpoints
    assert "kl_hard, kl_spike and kl_slow get no input" in kl
    assert "add algorithm.use_kl_in_reward=True" in kl and "actor_rollout_ref.actor.use_kl_loss=True" in kl
    assert "trainer.test_freq=-1" in validation and "val_drop" in validation
    assert "add trainer.test_freq=10" in validation


@pytest.mark.parametrize("kl_use", [{"algorithm": {"use_kl_in_reward": True}},
                                    {"actor_rollout_ref": {"actor": {"use_kl_loss": True}}}])
def test_checkpoints_a_kl_use_and_validation_give_no_line(kl_use):
    config = OmegaConf.merge({"trainer": {"save_freq": 10, "test_freq": 5}}, kl_use)
    assert missing_prerequisites(config) == []


def test_each_missing_setting_gives_its_own_line():
    no_saves = OmegaConf.merge(READY, {"trainer": {"save_freq": 0}})
    assert [line.split(" ")[1] for line in missing_prerequisites(no_saves)] == ["trainer.save_freq=0"]
    no_kl = OmegaConf.merge(READY, {"algorithm": {"use_kl_in_reward": False}})
    assert ["kl_hard" in line for line in missing_prerequisites(no_kl)] == [True]


def test_the_verl_page_shows_the_lines_as_the_plugin_prints_them():
    page = (Path(__file__).resolve().parents[2] / "docs" / "verl.md").read_text()
    assert all(f"    {line}\n" in page for line in missing_prerequisites({}))


def test_a_disabled_guard_says_nothing():
    assert missing_prerequisites({"klguard": {"guard": {"enable": False}}}) == []


def test_the_plugin_says_them_at_start_from_verls_own_config(tmp_path, capsys):
    verl = pytest.importorskip("verl") if os.environ.get("CI") != "true" else __import__("verl")
    from hydra import compose, initialize_config_dir

    from klguard.integrations.verl.trainer import KLGuardTrainer

    root = os.path.join(os.path.dirname(verl.__file__), "trainer", "config")
    with initialize_config_dir(config_dir=root, version_base=None):
        config = compose(config_name="ppo_trainer", overrides=[
            "trainer.v1.trainer_mode=klguard", f"trainer.default_local_dir={tmp_path}",
            "actor_rollout_ref.rollout.name=vllm"])
    assert missing_prerequisites(config) == missing_prerequisites({})  # verl 0.9.1's defaults, as composed
    KLGuardTrainer(config)
    said = capsys.readouterr().out.splitlines()
    assert said == missing_prerequisites({})
