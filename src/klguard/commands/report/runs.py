"""Read a run directory back: klguard's metrics.jsonl (or a TRL output folder's trainer_state.json) and events.jsonl."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from klguard.errors import UserError
from klguard.integrations.logs.stores import state_steps, trainer_state_file
from klguard.integrations.metric_maps import to_klguard_names
from klguard.ppo.generations import read_generations

VAL_HACKING_SUFFIX = "/hacking_rate/mean@1"


@dataclass
class RunRecord:
    """One training run as the report sees it: metrics per step and the guard's actions."""

    label: str
    path: Path
    rows: list[dict[str, float]]
    events: list[dict] = field(default_factory=list)
    generations: dict[int, list[dict]] = field(default_factory=dict)  # validation responses by step, where dumped

    def series(self, key: str) -> tuple[list[int], list[float]]:
        """Steps and finite values of metric ``key`` (a ``val-core/`` prefix picks the first gold metric)."""
        steps, values = [], []
        for row in self.rows:
            value = _lookup(row, key)
            if value is not None and math.isfinite(value):
                steps.append(int(row["step"]))
                values.append(float(value))
        return steps, values

    def last(self, key: str) -> float | None:
        _, values = self.series(key)
        return values[-1] if values else None

    def best(self, key: str) -> float | None:
        _, values = self.series(key)
        return max(values) if values else None

    @property
    def steps(self) -> int:
        """The last step logged (0 for a run that logged none)."""
        return int(self.rows[-1]["step"]) if self.rows else 0

    @property
    def action_count(self) -> int:
        """Guard actions taken (warnings are not actions)."""
        return sum(e.get("kind") != "warn" for e in self.events)

    def mean_last(self, key: str, n: int) -> float | None:
        """Mean of the last ``n`` values (rollout metrics are noisy: 64 samples a step)."""
        _, values = self.series(key)
        return sum(values[-n:]) / len(values[-n:]) if values else None


def _lookup(row: dict[str, float], key: str) -> float | None:
    if key.endswith("/") or key.startswith("val-aux/*"):
        prefix, suffix = (key, "/acc/") if key.endswith("/") else ("val-aux/", VAL_HACKING_SUFFIX)
        found = [v for k, v in sorted(row.items()) if k.startswith(prefix) and suffix in k]
        return found[0] if found else None
    return row.get(key)


def _read_jsonl(path: Path) -> list[dict]:
    out = []
    with open(path, encoding="utf-8") as fh:
        for number, line in enumerate(fh, 1):
            if not line.strip():
                continue
            try:
                out.append(json.loads(line))
            except json.JSONDecodeError as exc:
                raise UserError(f"{path}: line {number} is not JSON ({exc.msg})") from None
    return out


def load_run(path: str | Path, label: str | None = None) -> RunRecord:
    """Read a klguard run directory or a TRL output folder; one clear error when it is neither."""
    folder = Path(path).expanduser()
    metrics = folder / "metrics.jsonl"
    if metrics.is_file():
        rows = [r for r in _read_jsonl(metrics) if isinstance(r.get("step"), int)]
    else:
        rows = _trl_rows(folder)
    by_step: dict[int, dict] = {}
    for row in rows:  # a resumed run may repeat steps: the latest write of a step wins
        by_step[row["step"]] = row
    events_file = folder / "events.jsonl"
    events = _read_jsonl(events_file) if events_file.is_file() else []
    dumps = validation_dumps(folder)
    return RunRecord(label or folder.name, folder, [by_step[s] for s in sorted(by_step)], events,
                     read_generations(dumps) if dumps else {})


def validation_dumps(folder: Path) -> Path | None:
    """The folder a klguard run wrote its validation responses to (`trainer.validation_data_dir` in its
    config.yaml), where it exists."""
    config = folder / "config.yaml"
    if not config.is_file():
        return None
    try:
        trainer = (yaml.safe_load(config.read_text(encoding="utf-8")) or {}).get("trainer") or {}
    except yaml.YAMLError:
        return None  # the metrics are what the report needs; a damaged config costs only the samples panel
    where = trainer.get("validation_data_dir") if isinstance(trainer, dict) else None
    return Path(where).expanduser() if where and Path(where).expanduser().is_dir() else None


def _trl_rows(folder: Path) -> list[dict]:
    """The training steps of a TRL (transformers Trainer) output folder, under klguard's metric names."""
    state = trainer_state_file(folder)
    if state is None:
        raise UserError(f"{folder} is not a klguard run directory (no metrics.jsonl) nor a TRL output folder "
                        "(no trainer_state.json)")
    return [{**to_klguard_names(metrics, "trl"), "step": step} for step, metrics in state_steps(state)]
