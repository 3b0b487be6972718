"""Checkpoints as `global_step_N/` folders that are whole or absent, and verified before use.

A checkpoint holds the policy and critic as Hugging Face folders (safetensors), optimizer states
(`torch.save` of plain state dicts, read back with `weights_only=True`) and `trainer_state.json`
(step, KL controller, RNG states, data position). It is written into `.global_step_N.partial/`,
`manifest.json` (every file's relative path, size and sha256) is written last, everything is
fsynced, and only then is the folder renamed into place and `latest_checkpointed_iteration.txt`
(verl's name) moved. On load a checkpoint whose files do not match its manifest is skipped with a
one-line warning and the previous one is used. Retention (`max_to_keep`) spares the checkpoints the caller names,
such as the newest one the guard found stable (klguard.guard.session).

Test hook: `KLGUARD_TEST_KILL_IN_SAVE=N` SIGKILLs the process halfway through writing checkpoint N
(after the weights, before the state and manifest), to test that a killed write leaves no usable
`global_step_N`. It is read only by `CheckpointManager.save` and does nothing when unset.

Under torchrun every rank writes its shards into the side folder (klguard.distributed.sharded_checkpoint);
rank 0 creates the folder first and, after a barrier, writes the state and the manifest and publishes it.
"""

from __future__ import annotations

import errno
import json
import os
import re
import shutil
import signal
import sys
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import torch

from klguard.distributed.context import DistContext
from klguard.errors import UserError
from klguard.files import atomic_write_text, fsync_dir, fsync_tree, sha256_file

LATEST_FILE = "latest_checkpointed_iteration.txt"
STATE_FILE = "trainer_state.json"
MANIFEST_FILE = "manifest.json"
KILL_IN_SAVE_ENV = "KLGUARD_TEST_KILL_IN_SAVE"
_UNLISTED = {MANIFEST_FILE}
_STEP_DIR = re.compile(r"^global_step_(\d+)$")
_PARTIAL_DIR = re.compile(r"^\.global_step_\d+\.partial$")


def _listed_files(folder: Path) -> list[Path]:
    return sorted(p for p in folder.rglob("*") if p.is_file() and p.relative_to(folder).as_posix() not in _UNLISTED)


def write_manifest(folder: Path) -> None:
    files = {p.relative_to(folder).as_posix(): {"size": p.stat().st_size, "sha256": sha256_file(p)}
             for p in _listed_files(folder)}
    (folder / MANIFEST_FILE).write_text(json.dumps({"format": 1, "files": files}, indent=1, sort_keys=True))


def verify_checkpoint(folder: Path) -> str | None:
    """Why `folder` is not a whole checkpoint (missing file, wrong size or checksum), or None."""
    try:
        listed = json.loads((folder / MANIFEST_FILE).read_text())["files"]
    except FileNotFoundError:
        return f"no {MANIFEST_FILE}"
    except (OSError, ValueError, KeyError, TypeError) as exc:
        return f"unreadable {MANIFEST_FILE} ({type(exc).__name__})"
    if STATE_FILE not in listed:
        return f"{STATE_FILE} is not in {MANIFEST_FILE}"
    for rel, expected in sorted(listed.items()):
        path = folder / rel
        if not path.is_file():
            return f"{rel} is missing"
        if path.stat().st_size != expected["size"]:
            return f"{rel} has {path.stat().st_size} bytes, the manifest says {expected['size']}"
        if sha256_file(path) != expected["sha256"]:
            return f"{rel} does not match its sha256 checksum"
    return None


def _warn(message: str) -> None:
    print(f"klguard: warning: {message}", file=sys.stderr, flush=True)


class CheckpointManager:
    def __init__(self, run_dir: Path, max_to_keep: int | None = None, warn: Callable[[str], None] = _warn,
                 dist: DistContext | None = None) -> None:
        self.run_dir = Path(run_dir)
        self.max_to_keep = max_to_keep
        self.dist = dist or DistContext()
        self.warn = warn if self.dist.is_main else (lambda message: None)
        self._warned: set[int] = set()

    def steps(self) -> list[int]:
        """Steps of the checkpoint folders on disk (renamed into place, not yet verified), oldest first."""
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

    def is_valid(self, step: int) -> bool:
        """Whether checkpoint `step` matches its manifest now; warns once per damaged checkpoint."""
        why = verify_checkpoint(self.path(step))
        if why is not None and step not in self._warned:
            self._warned.add(step)
            self.warn(f"checkpoint {self.path(step)} is damaged ({why}); skipped, using the previous one")
        return why is None

    def _pointer(self) -> int | None:
        try:
            return int((self.run_dir / LATEST_FILE).read_text().strip())
        except (OSError, ValueError):
            return None

    def candidates(self) -> list[int]:
        """Steps to try, newest first: the `latest` pointer's, then older ones (newer folders than the
        pointer are left from an earlier run, or were renamed just before a kill: not trusted)."""
        steps, pointer = self.steps(), self._pointer()
        if pointer is not None:
            steps = [s for s in steps if s <= pointer]
        return steps[::-1]

    def latest(self) -> Path | None:
        """The newest checkpoint that matches its manifest."""
        return next((self.path(s) for s in self.candidates() if self.is_valid(s)), None)

    def save(self, step: int, write: Callable[[Path], None], state: dict[str, Any], keep: Iterable[int] = ()) -> Path:
        """Write a checkpoint with `write(folder)` (on every rank) plus `state`, then publish it atomically; retention
        spares the checkpoints of the steps in `keep`."""
        final = self.path(step)
        tmp = self.run_dir / f".global_step_{step}.partial"
        if self.dist.is_main:
            shutil.rmtree(tmp, ignore_errors=True)
            tmp.mkdir(parents=True)
        self.dist.barrier()
        try:
            write(tmp)
            self.dist.barrier()  # every rank's shards are written
            if self.dist.is_main:
                if os.environ.get(KILL_IN_SAVE_ENV) == str(step):  # test hook, see the module docstring
                    os.kill(os.getpid(), signal.SIGKILL)
                (tmp / STATE_FILE).write_text(json.dumps(state, indent=1, sort_keys=True))
                write_manifest(tmp)
                fsync_tree(tmp)
        except Exception as exc:
            if self.dist.is_main:  # never leave a half-written checkpoint taking the space
                shutil.rmtree(tmp, ignore_errors=True)
            if disk_full(exc):
                raise UserError(f"cannot write checkpoint {final}: no space left on its device "
                                f"({shutil.disk_usage(self.run_dir).free / 2**20:.0f} MiB free after removing the "
                                "partial one); free some, point trainer.default_local_dir elsewhere, or keep fewer "
                                "with trainer.max_actor_ckpt_to_keep") from None
            raise
        if self.dist.is_main:
            if final.exists():
                shutil.rmtree(final)
            os.replace(tmp, final)
            fsync_dir(self.run_dir)
            atomic_write_text(self.run_dir / LATEST_FILE, str(step))
            self._prune(set(keep))
        self._warned.discard(step)
        self.dist.barrier()  # published: every rank may read it
        return final

    def _prune(self, spared: set[int]) -> None:
        """Delete checkpoints beyond `max_to_keep` (never those in `spared`) and leftover partials."""
        for child in self.run_dir.iterdir():
            if _PARTIAL_DIR.match(child.name):
                shutil.rmtree(child, ignore_errors=True)
        if self.max_to_keep is None:
            return
        steps = self.steps()
        keep = set(steps[-self.max_to_keep :]) | spared
        for step in steps:
            if step not in keep:
                shutil.rmtree(self.path(step), ignore_errors=True)


def disk_full(exc: BaseException) -> bool:
    """Whether `exc` (or what it wraps) says the device is full: an OSError with ENOSPC, or a writer's own error
    (safetensors, torch.save, DCP) whose message carries the system's words for it."""
    while exc is not None:
        if isinstance(exc, OSError) and exc.errno == errno.ENOSPC:
            return True
        if "No space left on device" in str(exc):
            return True
        exc = exc.__cause__ or exc.__context__
    return False


def load_state(ckpt: Path) -> dict[str, Any]:
    """`trainer_state.json`."""
    return json.loads((Path(ckpt) / STATE_FILE).read_text())


def save_tensors(obj: Any, path: Path) -> None:
    torch.save(obj, path)


def load_tensors(path: Path) -> Any:
    """Read an optimizer state written by save_tensors; never unpickles arbitrary objects."""
    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:  # a pickle with code in it, or not a torch file at all
        raise UserError(f"{path} is not a plain tensor file ({type(exc).__name__}); refusing to load it") from None
