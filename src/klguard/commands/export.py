"""`klguard export CHECKPOINT OUT`: the policy of a checkpoint as one plain Hugging Face folder.

OUT holds `model.safetensors` (or its shards and index), `config.json`, `generation_config.json` and
the tokenizer: `AutoModelForCausalLM.from_pretrained(OUT)` loads it with no klguard installed.

CHECKPOINT is a run directory (its latest checkpoint), a `global_step_N/` folder, or a policy folder.
Two layouts of the policy weights are read, both merged into one full state dict before writing:

- `hf`: an HF folder (`actor/` today: klguard checkpoints are unsharded);
- `dcp`: a `torch.distributed.checkpoint` folder (a `.metadata` file and `*.distcp` shards, as
  FSDP2 writes them), with the model's `config.json` and tokenizer beside the shards or in
  a `huggingface/` sub-folder as verl writes them. The shards are merged offline on one process;
  the model's tensors may sit at the top level or under a `model` key.
"""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass
from pathlib import Path

import torch
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer, GenerationConfig

from klguard.errors import UserError
from klguard.model.loading import hf_load, load_causal_lm
from klguard.model.lora import add_lora, load_exact, merged_model, saved_lora
from klguard.runtime.checkpoint import CheckpointManager

KEY = "CHECKPOINT"
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


@dataclass(frozen=True)
class PolicySource:
    weights: Path  # the HF folder, or the DCP folder
    meta: Path  # where config.json and the tokenizer are
    layout: str  # "hf" | "dcp"


def find_policy(checkpoint: str | Path) -> PolicySource:
    """Locate the policy weights inside a run directory, a `global_step_N/` folder or a policy folder."""
    path = Path(checkpoint).expanduser()
    if not path.exists():
        raise UserError(f"{KEY}={checkpoint} does not exist")
    latest = CheckpointManager(path).latest()
    for folder in (latest / "actor" if latest else None, path / "actor", path):
        if folder is None:
            continue
        if (folder / ".metadata").is_file():
            meta = folder / "huggingface" if (folder / "huggingface" / "config.json").is_file() else folder
            return PolicySource(folder, meta, "dcp")
        if (folder / "config.json").is_file():
            return PolicySource(folder, folder, "hf")
    raise UserError(f"{KEY}={checkpoint} holds no policy (no actor/ folder, config.json or DCP .metadata)")


def load_dcp_state_dict(folder: Path) -> dict[str, torch.Tensor]:
    """Merge a sharded torch.distributed.checkpoint folder into one state dict, on one process."""
    from torch.distributed.checkpoint import FileSystemReader
    from torch.distributed.checkpoint.format_utils import _EmptyStateDictLoadPlanner
    from torch.distributed.checkpoint.state_dict_loader import _load_state_dict

    state: dict = {}
    _load_state_dict(state, storage_reader=FileSystemReader(folder), planner=_EmptyStateDictLoadPlanner(),
                     no_dist=True)
    if isinstance(state.get("model"), dict):
        state = state["model"]
    return {k: v for k, v in state.items() if isinstance(v, torch.Tensor)}


def _model_from_dcp(source: PolicySource) -> torch.nn.Module:
    config = hf_load(AutoConfig.from_pretrained, source.meta, KEY)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    adapters = saved_lora(config)
    if adapters is not None:
        add_lora(model, adapters)
    try:
        load_exact(model, load_dcp_state_dict(source.weights), f"{KEY}={source.weights}")
    except ValueError as exc:
        raise UserError(str(exc)) from None
    return model if adapters is None else merged_model(model)


def load_policy_for_export(source: PolicySource) -> torch.nn.Module:
    """The policy as a plain model: a LoRA run's adapters merged into its weights (klguard.model.lora)."""
    if source.layout == "dcp":
        return _model_from_dcp(source)
    config = hf_load(AutoConfig.from_pretrained, source.weights, KEY)
    return load_causal_lm(source.weights, config, KEY, False, keep_adapters=None)


def _generation_config(model: torch.nn.Module, tokenizer) -> GenerationConfig:
    gen = model.generation_config if model.generation_config is not None else GenerationConfig()
    for name in ("bos_token_id", "eos_token_id", "pad_token_id"):
        if getattr(gen, name, None) is None:
            setattr(gen, name, getattr(tokenizer, name, None))
    return gen


def export_checkpoint(checkpoint: str | Path, out: str | Path, *, dtype: str = "float32") -> Path:
    """Write the checkpoint's policy to `out` as one HF folder; returns `out`."""
    target = Path(out).expanduser()
    if target.exists() and (not target.is_dir() or any(target.iterdir())):
        raise UserError(f"OUT={out} already exists and is not an empty folder")
    source = find_policy(checkpoint)
    model = load_policy_for_export(source).to(DTYPES[dtype])
    tokenizer = hf_load(AutoTokenizer.from_pretrained, source.meta, KEY)
    model.generation_config = _generation_config(model, tokenizer)
    partial = target.with_name(f".{target.name}.partial")
    shutil.rmtree(partial, ignore_errors=True)
    model.save_pretrained(partial, safe_serialization=True)
    tokenizer.save_pretrained(partial)
    if target.exists():
        target.rmdir()
    os.replace(partial, target)
    return target
