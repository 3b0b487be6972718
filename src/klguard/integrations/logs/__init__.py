"""Reading any trainer's log as it is written: each step's metrics under the guard's (verl's) names.

The format is told from the content, not the file name (klguard.integrations.logs.detect). Each reader's `poll()`
returns the steps completed since the last call, as the trainer named them; `poll(final=True)` also the last step
when nothing more will come. `MappedLog` renames them through klguard.integrations.metric_maps (the
trainer's map, told by the names, and the user's `--map`), then reads the names no map knows by what they mean
(klguard.integrations.logs.meaning). Steps are read from the log, never counted, except in TRL's console dicts, which
carry none (their entries are numbered).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Protocol

from klguard.errors import UserError
from klguard.integrations.logs.console import KeyValueLines, TrlConsole, VerlConsole
from klguard.integrations.logs.detect import FORMATS, detect_format
from klguard.integrations.logs.jsonl import JsonLines
from klguard.integrations.logs.lines import Step
from klguard.integrations.logs.meaning import Inference, function_target, infer, is_candidate, rename
from klguard.integrations.logs.stores import CsvLog, MlflowLog, TensorBoardLog, TrainerStateLog, trainer_state_file
from klguard.integrations.logs.table import TableLog
from klguard.integrations.logs.wandb_run import WandbLog
from klguard.integrations.metric_maps import (
    guard_names,
    split_target,
    tensorboard_names,
    trainer_of_names,
    trainer_of_tensorboard_tags,
)

STORES = ("jsonl", "kv-lines", "csv", "table", "mlflow", "wandb")
"""Formats any trainer writes, where transformers' reporters name metrics `train/<name>` (read as `<name>`)."""

__all__ = ["FORMATS", "LogReader", "MappedLog", "detect_format", "open_log", "trainer_state_file"]


class LogReader(Protocol):
    path: Path
    format: str
    trainer: str | None

    def poll(self, final: bool = False) -> list[Step]: ...


class MappedLog:
    """A reader's steps under the guard's names. `trainer`: whose names (None: klguard's, kept as they are), told
    by the reader's format or, for formats any trainer writes, by the first step's names."""

    def __init__(self, reader: LogReader, user_map: Mapping[str, str] | None = None) -> None:
        self.reader, self.user_map = reader, dict(user_map or {})
        self.path, self.format = reader.path, reader.format
        self.trainer: str | None = reader.trainer
        self.told = reader.format in ("klguard", "verl", "verl-console", "trl-console", "trl")
        self.raw_names: set[str] = set()
        self.by_meaning = reader.format != "klguard"  # klguard's own names are the guard's
        self.inference = Inference()  # every name read by meaning so far; `unmapped`: the names no map reads
        self.news: list[tuple[str, str]] = []  # names read by meaning since the last `take_news()`
        self._kept: set[str] = set()  # names no map renamed
        self._present = {split_target(target)[0] for target in self.user_map.values()}

    def poll(self, final: bool = False) -> list[Step]:
        steps = [(step, self.map(raw)) for step, raw in self.reader.poll(final)]
        if self.by_meaning and steps:
            self._learn([metrics for _, metrics in steps])
        functions = {name: function_target(name) for name in self.inference.per_function}
        return [(step, rename(metrics, {**self.inference.renames, **functions})) for step, metrics in steps]

    def take_news(self) -> list[tuple[str, str]]:
        """The (log name, guard name) pairs read by meaning since the last call."""
        news, self.news = self.news, []
        return news

    def _learn(self, steps: list[dict[str, float]]) -> None:
        """Read new names by meaning, for the guard inputs no known name gives; earlier readings stay."""
        names = set().union(*steps)
        self._present |= names
        new = {n for n in names & self._kept if is_candidate(n)} - set(self.inference.unmapped) - set(
            self.inference.renames) - set(self.inference.per_function)
        if not new:
            return
        pool = set(self.inference.unmapped) | set(self.inference.per_function) | new
        found = infer(pool, self._present | set(self.inference.renames.values()))
        self.news += list(found.renames.items())
        self.inference.renames.update(found.renames)
        self.inference.ambiguous += [line for line in found.ambiguous if line not in self.inference.ambiguous]
        self.inference.per_function, self.inference.unmapped = found.per_function, found.unmapped

    def map(self, raw: dict[str, float]) -> dict[str, float]:
        self.raw_names.update(raw)
        if not self.told and raw:
            self.told = True
            if self.format == "tensorboard":
                self.trainer = trainer_of_tensorboard_tags(raw) or "verl"
            else:
                self.trainer = trainer_of_names([k.removeprefix("train/") for k in raw])
        if self.format == "tensorboard" and self.trainer in ("trl", "openrlhf"):
            raw = tensorboard_names(raw, self.trainer)
        elif self.format in STORES:
            raw = {k.removeprefix("train/") if k.removeprefix("train/") not in raw else k: v for k, v in raw.items()}
        out = guard_names(raw, self.trainer, self.user_map)
        self._kept.update(name for name in out if name in raw)
        return out

    @property
    def counted(self) -> bool:
        """Whether steps were numbered by entry (TRL's console dicts without tqdm's counter)."""
        return bool(getattr(self.reader, "counted", False))


def open_log(path: str | Path, fmt: str | None = None, user_map: Mapping[str, str] | None = None) -> MappedLog:
    """A reader of the log at `path` (a file or a folder), in `fmt` or the detected format."""
    path = Path(path).expanduser()
    if not path.exists():
        raise UserError(f"{path} does not exist")
    fmt = fmt or detect_format(path)
    if fmt not in FORMATS:
        raise UserError(f"--format {fmt!r} is not one of: {', '.join(FORMATS)}")
    if fmt in ("klguard", "verl", "jsonl"):
        file = path / "metrics.jsonl" if path.is_dir() and fmt == "klguard" else path
        if not file.is_file():
            raise UserError(f"{file} is not a file: a {fmt} log is one file")
        reader: LogReader = JsonLines(file, fmt)
    elif fmt in ("verl-console", "trl-console", "kv-lines", "csv", "table"):
        if not path.is_file():
            raise UserError(f"{path} is not a file: a {fmt} log is one file")
        reader = {"verl-console": VerlConsole, "trl-console": TrlConsole, "kv-lines": KeyValueLines,
                  "csv": CsvLog, "table": TableLog}[fmt](path)
    else:
        reader = {"tensorboard": TensorBoardLog, "trl": TrainerStateLog, "mlflow": MlflowLog,
                  "wandb": WandbLog}[fmt](path)
    return MappedLog(reader, user_map)
