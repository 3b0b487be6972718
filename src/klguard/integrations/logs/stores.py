"""Logs that a library writes and reads back: TensorBoard event files (tensorboard's own loader), transformers'
`trainer_state.json` under any file name (its `log_history`), CSV exports with a header row (the csv module) and
MLflow's local file store (`mlruns/<experiment>/<run>/metrics/<name>`: one `timestamp value step` line per value,
the layout MLflow documents; the MLflow client is not needed to read it)."""

from __future__ import annotations

import csv
import json
import math
from pathlib import Path

from klguard.errors import UserError
from klguard.integrations.logs.console import STEP_KEYS
from klguard.integrations.logs.lines import Raw, Step, StepBuffer


class TensorBoardLog:
    """Scalar events of every event file under a folder (or one file), grouped by step."""

    format, trainer = "tensorboard", None

    def __init__(self, path: Path) -> None:
        self.path = path
        self._loaders: dict[Path, object] = {}
        self.buffer = StepBuffer()

    def _files(self) -> list[Path]:
        return [self.path] if self.path.is_file() else sorted(self.path.rglob("events.out.tfevents.*"))

    def poll(self, final: bool = False) -> list[Step]:
        try:
            from tensorboard.backend.event_processing.event_file_loader import EventFileLoader
            from tensorboard.util import tensor_util
        except ImportError:
            raise UserError(f"{self.path}: reading TensorBoard event files needs tensorboard (pip install "
                            "tensorboard)") from None

        for file in self._files():
            loader = self._loaders.setdefault(file, EventFileLoader(str(file)))
            for event in loader.Load():
                for value in event.summary.value:
                    number = (value.simple_value if value.HasField("simple_value")
                              else float(tensor_util.make_ndarray(value.tensor)))
                    self.buffer.add(int(event.step), value.tag, number)
        return self.buffer.ready(final)


class TrainerStateLog:
    """transformers' (TRL's) trainer_state.json, rewritten at each save: re-read when it changes; the training
    steps (entries with a `loss`) not yet returned. A folder: its own trainer_state.json or its newest
    checkpoint's, whichever reaches furthest."""

    format, trainer = "trl", "trl"

    def __init__(self, path: Path) -> None:
        self.path = path
        self._mtime: float | None = None
        self._last = -1

    def poll(self, final: bool = False) -> list[Step]:
        found = ((self.path, None) if self.path.is_file() else _furthest_state(self.path)) or (None, None)
        file, parsed = found
        if file is None or file.stat().st_mtime == self._mtime:
            return []
        self._mtime = file.stat().st_mtime
        rows = [(step, data) for step, data in (parsed or state_steps(file)) if step > self._last]
        if rows:
            self._last = rows[-1][0]
        return rows


def trainer_state_file(folder: Path) -> Path | None:
    """The trainer_state.json of a TRL output folder that reaches furthest."""
    found = _furthest_state(folder)
    return None if found is None else found[0]


def _furthest_state(folder: Path) -> tuple[Path, list[Step]] | None:
    newest = max(folder.glob("checkpoint-*/trainer_state.json"), key=_checkpoint_step, default=None)
    states = [(s, state_steps(s)) for s in (folder / "trainer_state.json", newest) if s is not None and s.is_file()]
    return max(states, key=lambda found: max((r for r, _ in found[1]), default=0), default=None)


def _checkpoint_step(state: Path) -> int:
    tail = state.parent.name.rpartition("-")[2]
    return int(tail) if tail.isdigit() else -1


def state_steps(state: Path) -> list[Step]:
    """The training steps of one trainer_state.json, under the trainer's own names (NaN kept)."""
    try:
        history = json.loads(state.read_text(encoding="utf-8"), parse_constant=float)["log_history"]
    except (ValueError, KeyError, TypeError) as exc:
        raise UserError(f"{state}: not a transformers trainer state ({exc.__class__.__name__})") from None
    return [(int(r["step"]), {k: float(v) for k, v in r.items() if _numeric(v) and k != "step"}) for r in history
            if isinstance(r, dict) and "loss" in r and isinstance(r.get("step"), int)]


def _numeric(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


LONG_NAME_COLUMNS = ("metric", "key", "name", "metric_name")
LONG_VALUE_COLUMNS = ("value", "metric_value")
LONG_RUN_COLUMNS = ("run_name", "run", "run_id")


class CsvLog:
    """A CSV export with a header row; the step is a column (`step`, `Step`, `_step`, `global_step`, ...). W&B's
    exports name columns `<run> - <metric>` (and `<metric>__MIN`/`__MAX` bands, skipped). A long export, one row
    per metric (`run_name,metric,step,value`, as W&B's API or pandas' melt writes it), is read whole at the end:
    its rows come in any order, so a step is complete only once the file is."""

    format, trainer = "csv", None

    def __init__(self, path: Path) -> None:
        self.path = path
        self._rows = 0

    def poll(self, final: bool = False) -> list[Step]:
        with open(self.path, newline="", encoding="utf-8", errors="replace") as fh:
            rows = list(csv.reader(fh))
        if not rows:
            return []
        header = [name.strip() for name in rows[0]]
        column = next((i for i, name in enumerate(header) if name.lower() in STEP_KEYS), None)
        if column is None:
            raise UserError(f"{self.path}: the header row has no step column ({', '.join(STEP_KEYS[:4])}, ...): "
                            "steps are read, never counted")
        lowered = [name.lower() for name in header]
        names = next((lowered.index(n) for n in LONG_NAME_COLUMNS if n in lowered), None)
        values = next((lowered.index(n) for n in LONG_VALUE_COLUMNS if n in lowered), None)
        if names is not None and values is not None:
            return self._long(rows, column, names, values) if final else []
        body = rows[1:] if final else rows[1:-1]  # the last row may still be being written
        out: list[Step] = []
        for number, row in enumerate(body[self._rows:], start=self._rows + 2):
            step = _float(row[column]) if column < len(row) else None
            if step is None or not math.isfinite(step):
                raise UserError(f"{self.path}: row {number} has no step in column {header[column]!r}")
            raw = {_csv_name(name): value for name, text in zip(header, row, strict=False)
                   if name != header[column] and not name.endswith(("__MIN", "__MAX"))
                   and (value := _float(text)) is not None}
            out.append((int(step), raw))
        self._rows = len(body)
        return out


    def _long(self, rows: list[list[str]], step_col: int, name_col: int, value_col: int) -> list[Step]:
        """One step per distinct step value, its metrics gathered from every row of it (once: read at the end)."""
        if self._rows:
            return []
        header = [name.strip().lower() for name in rows[0]]
        run_col = next((header.index(n) for n in LONG_RUN_COLUMNS if n in header), None)
        runs = {row[run_col] for row in rows[1:] if run_col is not None and run_col < len(row)}
        if len(runs) > 1:
            shown = ", ".join(sorted(runs)[:4])
            raise UserError(f"{self.path} holds {len(runs)} runs in its {rows[0][run_col]!r} column ({shown}"
                            f"{', ...' if len(runs) > 4 else ''}): write one run's rows to a file of its own")
        steps: dict[int, dict[str, float]] = {}
        for number, row in enumerate(rows[1:], start=2):
            if len(row) <= max(step_col, name_col, value_col):
                raise UserError(f"{self.path}: row {number} has {len(row)} fields, the header {len(header)}")
            step = _float(row[step_col])
            if step is None or not math.isfinite(step):
                raise UserError(f"{self.path}: row {number} has no step in column {rows[0][step_col]!r}")
            value = _float(row[value_col])
            if value is not None:
                steps.setdefault(int(step), {})[_csv_name(row[name_col].strip())] = value
        self._rows = len(rows) - 1
        return sorted(steps.items())


def _csv_name(name: str) -> str:
    return name.rpartition(" - ")[2]


def _float(text: str) -> float | None:
    try:
        return float(text)
    except ValueError:
        return None


class MlflowLog:
    """One MLflow run of a local file store: `mlruns/<experiment>/<run>/metrics/<name>` (a name with `/` is a
    subfolder), each line `timestamp value step`."""

    format, trainer = "mlflow", None

    def __init__(self, path: Path) -> None:
        self.path = path
        runs = mlflow_runs(path)
        if len(runs) != 1:
            names = ", ".join(str(r.relative_to(path)) for r in runs[:4])
            raise UserError(f"{path} holds {len(runs)} MLflow runs ({names}{', ...' if len(runs) > 4 else ''}): "
                            "pass one run's folder")
        self.metrics = runs[0] / "metrics"
        self._offsets: dict[Path, int] = {}
        self.buffer = StepBuffer()

    def poll(self, final: bool = False) -> list[Step]:
        for file in sorted(p for p in self.metrics.rglob("*") if p.is_file()):
            name = file.relative_to(self.metrics).as_posix()
            with open(file, "rb") as fh:
                fh.seek(self._offsets.get(file, 0))
                chunk = fh.read()
            complete = chunk[: chunk.rfind(b"\n") + 1]
            self._offsets[file] = self._offsets.get(file, 0) + len(complete)
            for line in complete.decode("utf-8").splitlines():
                parts = line.split()
                if len(parts) == 3:
                    self.buffer.add(int(parts[2]), name, float(parts[1]))
        return self.buffer.ready(final)


def mlflow_runs(path: Path) -> list[Path]:
    """The run folders (a `metrics/` folder beside a `meta.yaml`) at or under `path`."""
    if (path / "metrics").is_dir() and (path / "meta.yaml").is_file():
        return [path]
    return sorted(p.parent for p in path.glob("**/metrics") if p.is_dir() and (p.parent / "meta.yaml").is_file())


__all__ = ["CsvLog", "MlflowLog", "Raw", "TensorBoardLog", "TrainerStateLog", "state_steps", "trainer_state_file"]
