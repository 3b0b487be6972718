"""Checkpoints as `global_step_N/` folders that appear atomically (written aside, then renamed).

A checkpoint holds the policy and critic as Hugging Face folders (safetensors), optimizer states
(`torch.save` of plain state dicts, read back with `weights_only=True`) and `trainer_state.json`
(step, KL controller, RNG states, data position). `latest_checkpointed_iteration.txt` (verl's name)
moves only once the folder is whole.
"""

from __future__ import annotations

import json
import os
import re
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

LATEST_FILE = "latest_checkpointed_iteration.txt"
STATE_FILE = "trainer_state.json"
_STEP_DIR = re.compile(r"^global_step_(\d+)$")


def _fsync_tree(root: Path) -> None:
    for path in sorted(root.rglob("*")):
        if path.is_file():
            with open(path, "rb") as fh:
                os.fsync(fh.fileno())
    _fsync_dir(root)


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def atomic_write_text(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    with open(tmp, "w", encoding="utf-8") as fh:
        fh.write(text)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)


class CheckpointManager:
    def __init__(self, run_dir: Path, max_to_keep: int | None = None) -> None:
        self.run_dir = Path(run_dir)
        self.max_to_keep = max_to_keep

    def steps(self) -> list[int]:
        """Steps of the complete checkpoints on disk, oldest first."""
        if not self.run_dir.is_dir():
            return []
        found = []
        for child in self.run_dir.iterdir():
            match = _STEP_DIR.match(child.name)
            if match and (child / STATE_FILE).is_file():
                found.append(int(match.group(1)))
        return sorted(found)

    def path(self, step: int) -> Path:
        return self.run_dir / f"global_step_{step}"

    def latest(self) -> Path | None:
        pointer = self.run_dir / LATEST_FILE
        if pointer.is_file():
            candidate = self.path(int(pointer.read_text().strip()))
            if (candidate / STATE_FILE).is_file():
                return candidate
        steps = self.steps()
        return self.path(steps[-1]) if steps else None

    def save(self, step: int, write: Callable[[Path], None], state: dict[str, Any]) -> Path:
        """Write a checkpoint with `write(folder)` plus `state`, then publish it atomically."""
        final = self.path(step)
        tmp = self.run_dir / f".global_step_{step}.partial"
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
        write(tmp)
        (tmp / STATE_FILE).write_text(json.dumps(state, indent=1, sort_keys=True))
        _fsync_tree(tmp)
        if final.exists():
            shutil.rmtree(final)
        os.replace(tmp, final)
        _fsync_dir(self.run_dir)
        atomic_write_text(self.run_dir / LATEST_FILE, str(step))
        self._prune()
        return final

    def _prune(self) -> None:
        if self.max_to_keep is None:
            return
        for step in self.steps()[: -self.max_to_keep]:
            shutil.rmtree(self.path(step), ignore_errors=True)


def load_state(ckpt: Path) -> dict[str, Any]:
    return json.loads((Path(ckpt) / STATE_FILE).read_text())


def save_tensors(obj: Any, path: Path) -> None:
    torch.save(obj, path)


def load_tensors(path: Path) -> Any:
    """Read an optimizer state written by save_tensors; never unpickles arbitrary objects."""
    return torch.load(path, map_location="cpu", weights_only=True)
