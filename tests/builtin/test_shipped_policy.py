"""The built-in policy ships in the package: the default recipe loads it as is (no SFT), a damaged file is one
line with the way out, another recipe or a rebuilt cache is used instead of it."""

from __future__ import annotations

import shutil

import pytest

from klguard.builtin import shipped, warm_start
from klguard.builtin.arith import make_arith_rows
from klguard.builtin.shipped import file_digests, shipped_folder, shipped_policy
from klguard.builtin.warm_start import ensure_sft_policy, evaluate_policy, sft_cache_dir, sft_recipe
from klguard.commands.cli import main
from klguard.config import load_config
from klguard.errors import UserError
from klguard.model.loading import hf_load


def _default(*overrides: str):
    config = load_config(None, list(overrides)).config
    return config.sft, config.data.builtin_form


@pytest.fixture
def no_sft(monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("SFT ran although the policy ships")
    monkeypatch.setattr(warm_start, "run_sft", refuse)


@pytest.fixture
def damaged(tmp_path, monkeypatch):
    """A copy of the shipped folder that klguard reads instead of the real one; the test damages it."""
    copy = tmp_path / "builtin_policy"
    shutil.copytree(shipped_folder(), copy)
    monkeypatch.setattr(shipped, "shipped_folder", lambda: copy)
    return copy


def test_the_default_recipe_loads_the_shipped_policy_without_training(tmp_path, no_sft):
    sft, form = _default(f"sft.cache_dir={tmp_path}")
    assert ensure_sft_policy(sft, form=form) == shipped_folder()
    assert not any(tmp_path.iterdir())  # nothing trained, nothing cached


def test_the_shipped_files_match_their_manifest_and_the_policy_answers():
    import json

    from transformers import AutoModelForCausalLM, AutoTokenizer

    folder = shipped_folder()
    manifest = json.loads((folder / "manifest.json").read_text())
    sft, form = _default()
    assert manifest["recipe"] == sft_recipe(sft, form)
    assert manifest["files"] == file_digests(folder)
    assert {"model.safetensors", "config.json", "tokenizer.json", "tokenizer_config.json"} <= manifest["files"].keys()
    model = hf_load(AutoModelForCausalLM.from_pretrained, folder, "shipped")
    tokenizer = hf_load(AutoTokenizer.from_pretrained, folder, "shipped")
    tokenizer.padding_side = "left"
    stats = evaluate_policy(model, tokenizer, make_arith_rows(64, "val", 7, form=form), seed=0)
    # SFT stopped at held-out accuracy 0.57 at temperature 1 (512 problems); an untrained policy scores 0
    assert stats["accuracy"] > 0.3, stats


def test_a_damaged_weight_file_is_one_line_naming_it_with_the_rebuild_hint(damaged):
    weights = damaged / "model.safetensors"
    data = bytearray(weights.read_bytes())
    data[len(data) // 2] ^= 0xFF
    weights.write_bytes(bytes(data))
    with pytest.raises(UserError, match=r"damaged: .*model\.safetensors fails its SHA-256 check.*klguard sft"):
        shipped_policy(sft_recipe(*_default()))


def test_a_missing_file_is_named(damaged):
    (damaged / "tokenizer.json").unlink()
    with pytest.raises(UserError, match=r"tokenizer\.json missing"):
        shipped_policy(sft_recipe(*_default()))


def test_klguard_train_on_a_damaged_install_exits_2_with_one_line(damaged, tmp_path, capsys, no_sft):
    (damaged / "config.json").write_text("{}")
    code = main(["train", f"sft.cache_dir={tmp_path / 'cache'}", f"trainer.default_local_dir={tmp_path / 'run'}",
                 "trainer.total_training_steps=1"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2
    assert len(err) == 1 and "config.json fails its SHA-256 check" in err[0] and "klguard sft" in err[0]


def test_another_recipe_is_not_the_shipped_policy():
    assert shipped_policy(sft_recipe(*_default("sft.seed=1"))) is None
    assert shipped_policy(sft_recipe(*_default("data.builtin_form=mixed"))) is None


def test_a_rebuilt_policy_in_the_cache_wins(tmp_path, no_sft):
    sft, form = _default(f"sft.cache_dir={tmp_path}")
    rebuilt = sft_cache_dir(sft, form)
    rebuilt.mkdir(parents=True)
    (rebuilt / "sft_metrics.json").write_text("{}")
    assert ensure_sft_policy(sft, form=form) == rebuilt
