"""Bad inputs around real models give one line naming the culprit and exit code 2."""

from __future__ import annotations

import shutil

import pytest

from klguard.commands.cli import main


def _one_error_line(capsys) -> str:
    lines = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert len(lines) == 1, lines
    return lines[0]


def _not_a_model(tmp_path, assets):
    folder = tmp_path / "notes"
    folder.mkdir()
    (folder / "README.md").write_text("not a model")
    return folder


def _broken_config(tmp_path, assets):
    folder = tmp_path / "broken"
    folder.mkdir()
    (folder / "config.json").write_text("{}")
    (folder / "tokenizer_config.json").write_text("{}")
    return folder


@pytest.mark.parametrize(("key", "make", "expected"), [
    ("actor_rollout_ref.model.path", lambda t, a: t / "missing", "does not exist"),
    ("actor_rollout_ref.model.path", _not_a_model, "is not a Hugging Face model folder (no config.json)"),
    ("actor_rollout_ref.model.path", _broken_config, "could not be loaded"),
    ("actor_rollout_ref.model.path", lambda t, a: a.rm, "is not a causal language model"),  # an RM as policy
    ("critic.model.path", lambda t, a: t / "missing", "does not exist"),
    ("reward_model.model.path", lambda t, a: t / "missing", "does not exist"),
    ("reward_model.model.path", _not_a_model, "is not a Hugging Face model folder (no config.json)"),
    ("reward_model.model.path", lambda t, a: a.policy, "is not a sequence-classification model"),
])
def test_bad_model_folder_is_one_line(base_overrides, assets, tmp_path, capsys, key, make, expected):
    folder = make(tmp_path, assets)
    extra = ["reward_model.enable=true"] if key.startswith("reward_model") else []
    assert main(["train", *base_overrides, *extra, f"{key}={folder}"]) == 2
    line = _one_error_line(capsys)
    assert line.startswith(f"klguard: error: {key}={folder}"), line
    assert expected in line


def test_reward_model_without_path_is_a_config_error(base_overrides, capsys):
    assert main(["train", *base_overrides, "reward_model.enable=true"]) == 2
    assert "reward_model.model.path" in _one_error_line(capsys)


def test_base_model_without_chat_template_is_named(base_overrides, assets, tmp_path, capsys):
    folder = tmp_path / "base"
    shutil.copytree(assets.policy, folder)
    (folder / "chat_template.jinja").unlink()
    assert main(["train", *base_overrides, f"actor_rollout_ref.model.path={folder}"]) == 2
    assert "no chat template" in _one_error_line(capsys)
