"""Model and optimizer states with torch.distributed.checkpoint (DCP): each rank writes its shards
(`__<rank>_0.distcp`, rank 0 the `.metadata`), and a folder written at N ranks loads at M ranks, one
process included (DCP reshards on load). Unsharded models keep klguard's single-process layout (an HF
folder and a `torch.save`d optimizer state); these functions read both layouts at any world size.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from pathlib import Path

import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_optimizer_state_dict,
    set_model_state_dict,
    set_optimizer_state_dict,
)

from klguard.distributed.collectives import any_rank
from klguard.distributed.context import is_distributed
from klguard.distributed.fsdp import is_sharded

FULL = StateDictOptions(full_state_dict=True)


def is_dcp(folder: Path) -> bool:
    return (Path(folder) / ".metadata").is_file()


def _load(state: dict, folder: Path) -> None:
    with warnings.catch_warnings():  # one process reading a sharded folder: DCP warns that it assumes so
        warnings.filterwarnings("ignore", message=".*assuming the intent is to load in a single process.*")
        dcp.load(state, checkpoint_id=folder)


def save_model(model: torch.nn.Module, folder: Path) -> None:
    """Collective: every rank writes its shards of `model` into `folder`."""
    dcp.save({"model": get_model_state_dict(model)}, checkpoint_id=folder)


NO_STEP_YET = "no_step_yet"
"""Marker file of an optimizer folder whose optimizer had no state (fresh, or cleared by a rollback to the initial
policy). `get_optimizer_state_dict` would invent one (a zero-gradient step at lr 0, so AdamW's step count would be
1 ahead and its first real update smaller than a fresh optimizer's), so nothing else is written."""


def save_optimizer(model: torch.nn.Module, optim: torch.optim.Optimizer, folder: Path) -> None:
    """Collective: every rank writes its shards of the optimizer state (or, with none yet, rank 0 the marker)."""
    if not any_rank(bool(optim.state)):
        if not is_distributed() or torch.distributed.get_rank() == 0:
            folder.mkdir(parents=True, exist_ok=True)
            (folder / NO_STEP_YET).write_text("the optimizer had taken no step\n")
        return
    dcp.save({"optim": get_optimizer_state_dict(model, optim)}, checkpoint_id=folder)


def load_full_state(model: torch.nn.Module, state: dict[str, torch.Tensor]) -> None:
    """A full (unsharded) state dict into `model`, sharded or not."""
    if is_sharded(model):
        set_model_state_dict(model, state, options=FULL)
    else:
        model.load_state_dict(state)


def load_weights(model: torch.nn.Module, folder: Path | None, fresh: Callable[[], torch.nn.Module]) -> None:
    """`model`'s weights from a DCP folder, or else from `fresh()` (a model loaded from an HF folder)."""
    if folder is not None and is_dcp(folder):
        state = {"model": get_model_state_dict(model)}
        _load(state, folder)
        set_model_state_dict(model, state["model"])
    else:
        load_full_state(model, fresh().state_dict())


def copy_weights(src: torch.nn.Module, dst: torch.nn.Module,
                 convert: Callable[[dict[str, torch.Tensor]], dict[str, torch.Tensor]] | None = None) -> None:
    """`dst` takes `src`'s weights (sharded or not, on any meshes); `convert` maps `src`'s full state dict to
    `dst`'s names (a LoRA actor's merged weights into a plain reference)."""
    if not is_sharded(src) and not is_sharded(dst) and convert is None:
        dst.load_state_dict(src.state_dict())
        return
    state = get_model_state_dict(src, options=FULL) if is_sharded(src) else src.state_dict()
    load_full_state(dst, convert(state) if convert is not None else state)


def _by_name(model: torch.nn.Module, state: dict) -> dict:
    """A torch optimizer state keyed by parameter index (klguard's single-process layout) keyed by name."""
    names = [n for n, p in model.named_parameters() if p.requires_grad]
    groups = [{**g, "params": [names[i] for i in g["params"]]} for g in state["param_groups"]]
    return {"state": {names[i]: s for i, s in state["state"].items()}, "param_groups": groups}


def load_optimizer(model: torch.nn.Module, optim: torch.optim.Optimizer, folder: Path,
                   read_plain: Callable[[], dict]) -> None:
    """Optimizer state from a DCP folder, or from `read_plain()` (the single-process layout)."""
    if (folder / NO_STEP_YET).is_file():
        optim.state.clear()
    elif is_dcp(folder):
        state = {"optim": get_optimizer_state_dict(model, optim)}
        _load(state, folder)
        set_optimizer_state_dict(model, optim, state["optim"])
    elif is_sharded(model):
        set_optimizer_state_dict(model, optim, _by_name(model, read_plain()), options=FULL)
    else:
        optim.load_state_dict(read_plain())
