"""Reading another trainer's log as it is written: each step's metrics under klguard's (verl's) names.

Formats: klguard's `metrics.jsonl`, verl's `file` logger (`{"step": N, "data": {...}}` lines), TensorBoard event
files (verl's tags, OpenRLHF's and TRL's `train/...`), and TRL's `trainer_state.json`. A reader's `poll()` returns
the steps completed since the last call; `poll(final=True)` also the last step when nothing more will come.
Each format's names go through klguard.integrations.metric_maps, the one map per trainer.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Protocol

from klguard.errors import UserError
from klguard.integrations.metric_maps import from_tensorboard, to_klguard_names, trainer_of_tensorboard_tags

FORMATS = ("klguard", "verl", "tensorboard", "trl")
Step = tuple[int, dict[str, float]]


class LogReader(Protocol):
    path: Path
    format: str

    def poll(self, final: bool = False) -> list[Step]: ...


class JsonLinesReader:
    """klguard's metrics.jsonl or verl's file logger: one complete line per step, read as it is appended. A file
    that shrank was started over (verl truncates it on relaunch): it is read again from its start."""

    def __init__(self, path: Path, fmt: str) -> None:
        self.path, self.format = path, fmt
        self._offset, self._line = 0, 0

    def poll(self, final: bool = False) -> list[Step]:
        if self.path.stat().st_size < self._offset:
            self._offset, self._line = 0, 0
        with open(self.path, "rb") as fh:
            fh.seek(self._offset)
            chunk = fh.read()
        complete = chunk[: chunk.rfind(b"\n") + 1]
        self._offset += len(complete)
        out = []
        for raw in complete.decode("utf-8").splitlines():
            self._line += 1
            if raw.strip():
                out.append(self._parse(raw))
        return out

    def _parse(self, raw: str) -> Step:
        try:
            record = json.loads(raw)
        except json.JSONDecodeError as exc:
            raise UserError(f"{self.path}: line {self._line} is not JSON ({exc.msg})") from None
        if self.format == "verl":
            ok = isinstance(record, dict) and isinstance(record.get("step"), int) and isinstance(record.get("data"),
                                                                                                 dict)
            data = record.get("data") if ok else None
        else:
            ok = isinstance(record, dict) and isinstance(record.get("step"), int)
            data = {k: v for k, v in record.items() if k != "step"} if ok else None
        if data is None:
            shape = '{"step": N, "data": {...}}' if self.format == "verl" else '{"step": N, ...}'
            raise UserError(f"{self.path}: line {self._line} is not a {self.format} metrics line {shape}")
        return record["step"], to_klguard_names(data, None)


class TensorBoardReader:
    """Scalar events of every event file under a folder (or one file), grouped by step. A step is complete when
    a later step's scalar arrives, or at the end (`final`). Tags are mapped by the trainer that wrote them."""

    def __init__(self, path: Path) -> None:
        self.path, self.format = path, "tensorboard"
        self._loaders: dict[Path, object] = {}
        self._pending: dict[int, dict[str, float]] = {}
        self._trainer: str | None = None

    def _files(self) -> list[Path]:
        if self.path.is_file():
            return [self.path]
        return sorted(self.path.rglob("events.out.tfevents.*"))

    def poll(self, final: bool = False) -> list[Step]:
        from tensorboard.backend.event_processing.event_file_loader import EventFileLoader
        from tensorboard.util import tensor_util

        for file in self._files():
            loader = self._loaders.setdefault(file, EventFileLoader(str(file)))
            for event in loader.Load():
                for value in event.summary.value:
                    number = (value.simple_value if value.HasField("simple_value")
                              else float(tensor_util.make_ndarray(value.tensor)))
                    self._pending.setdefault(int(event.step), {})[value.tag] = number
        if not self._pending:
            return []
        ready = sorted(self._pending) if final else sorted(self._pending)[:-1]
        return [self._mapped(step, self._pending.pop(step)) for step in ready]

    def _mapped(self, step: int, tags: dict[str, float]) -> Step:
        if self._trainer is None:
            self._trainer = trainer_of_tensorboard_tags(tags)
        return step, from_tensorboard(tags, self._trainer)


class TrainerStateReader:
    """TRL's (transformers') trainer_state.json, rewritten at each save: re-read when it changes; the training
    steps not yet returned."""

    def __init__(self, path: Path) -> None:
        self.path, self.format = path, "trl"
        self._mtime: float | None = None
        self._last = -1

    def poll(self, final: bool = False) -> list[Step]:
        found = ((self.path, None) if self.path.is_file() else _furthest_state(self.path)) or (None, None)
        file, parsed = found
        if file is None or file.stat().st_mtime == self._mtime:
            return []
        self._mtime = file.stat().st_mtime
        rows = [(step, data) for step, data in (parsed or trl_steps(file)) if step > self._last]
        if rows:
            self._last = rows[-1][0]
        return rows


def trainer_state_file(folder: Path) -> Path | None:
    """The trainer_state.json of a TRL output folder that reaches furthest: the folder's own (save_state) or its
    newest checkpoint's."""
    found = _furthest_state(folder)
    return None if found is None else found[0]


def _furthest_state(folder: Path) -> tuple[Path, list[Step]] | None:
    """That file and its parsed steps (each candidate is read once)."""
    newest = max(folder.glob("checkpoint-*/trainer_state.json"), key=_checkpoint_step, default=None)
    states = [(s, trl_steps(s)) for s in (folder / "trainer_state.json", newest) if s is not None and s.is_file()]
    return max(states, key=lambda found: max((r for r, _ in found[1]), default=0), default=None)


def _checkpoint_step(state: Path) -> int:
    """checkpoint-N/trainer_state.json -> N (-1 for a folder not named so)."""
    tail = state.parent.name.rpartition("-")[2]
    return int(tail) if tail.isdigit() else -1


def trl_steps(state: Path) -> list[Step]:
    """The training steps of one trainer_state.json, under klguard's names."""
    try:
        history = json.loads(state.read_text(encoding="utf-8"))["log_history"]
    except (ValueError, KeyError, TypeError) as exc:
        raise UserError(f"{state}: not a transformers trainer state ({exc.__class__.__name__})") from None
    return [(int(r["step"]), to_klguard_names(r, "trl")) for r in history
            if isinstance(r, dict) and "loss" in r and isinstance(r.get("step"), int)]


def detect_format(path: Path) -> str:
    """The format of a log file or folder; UserError naming the path when none fits."""
    if path.is_dir():
        if (path / "metrics.jsonl").is_file():
            return "klguard"
        if trainer_state_file(path) is not None:
            return "trl"
        if next(path.rglob("events.out.tfevents.*"), None) is not None:
            return "tensorboard"
        raise UserError(f"{path}: no metrics.jsonl, trainer_state.json or TensorBoard event file in it: pass a log "
                        "file, or --format")
    if path.name.startswith("events.out.tfevents."):
        return "tensorboard"
    if path.name == "trainer_state.json":
        return "trl"
    with open(path, encoding="utf-8", errors="replace") as fh:
        first = next((line for line in fh if line.strip()), None)
    if first is None:
        raise UserError(f"{path} is empty: its format cannot be told yet; pass --format ({', '.join(FORMATS)})")
    try:
        record = json.loads(first)
    except json.JSONDecodeError:
        raise UserError(f"{path}: line 1 is not JSON; the formats klguard reads: {', '.join(FORMATS)}") from None
    if isinstance(record, dict) and isinstance(record.get("data"), dict) and "step" in record:
        return "verl"
    if isinstance(record, dict) and "step" in record:
        return "klguard"
    raise UserError(f"{path}: line 1 is neither a klguard nor a verl metrics line")


def open_log(path: str | Path, fmt: str | None = None) -> LogReader:
    """A reader of the log at `path` (a file or a folder), in `fmt` or the detected format."""
    path = Path(path).expanduser()
    if not path.exists():
        raise UserError(f"{path} does not exist")
    fmt = fmt or detect_format(path)
    if fmt not in FORMATS:
        raise UserError(f"--format {fmt!r} is not one of: {', '.join(FORMATS)}")
    if fmt in ("klguard", "verl"):
        file = path / "metrics.jsonl" if path.is_dir() else path
        if not file.is_file():
            raise UserError(f"{file} does not exist")
        return JsonLinesReader(file, fmt)
    if fmt == "tensorboard":
        return TensorBoardReader(path)
    return TrainerStateReader(path)
