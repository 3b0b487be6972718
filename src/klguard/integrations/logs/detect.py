"""Telling a log's format from its content (a folder: from the files in it), never from a file's name alone."""

from __future__ import annotations

import csv
import json
from pathlib import Path

from klguard.errors import UserError
from klguard.integrations.logs.console import sniff
from klguard.integrations.logs.jsonl import json_step
from klguard.integrations.logs.stores import mlflow_runs, trainer_state_file
from klguard.integrations.logs.table import table_format
from klguard.integrations.logs.wandb_run import wandb_file

FORMATS = ("klguard", "verl", "jsonl", "verl-console", "trl-console", "kv-lines", "table", "trl", "tensorboard", "csv",
           "mlflow", "wandb")
"""klguard: klguard's metrics.jsonl; verl: verl's file logger; jsonl: any flat JSON lines; verl-console,
trl-console, kv-lines: console output; table: pipe and whitespace tables (notebook progress tables); trl:
transformers' trainer_state.json; the rest: their libraries' stores."""
SNIFF_BYTES, SNIFF_LINES = 1 << 20, 2000  # a console log may open with a long config dump


class NoMetricsYet(UserError):
    """A text log with no metrics line in its first lines: not a log klguard reads, or one whose trainer has not
    logged a step yet (`--follow` waits for it)."""
TB_MAGIC = b"\x18\x00\x00\x00\x00\x00\x00\x00"  # the first TFRecord of an event file: its 24-byte header event


def detect_format(path: Path) -> str:
    """The format of a log file or folder; UserError naming the path when none fits."""
    if path.is_dir():
        return _folder_format(path)
    with open(path, "rb") as fh:
        head = fh.read(SNIFF_BYTES)
    if path.name.startswith("events.out.tfevents.") or head.startswith(TB_MAGIC):
        return "tensorboard"
    if head.startswith(b":W&B"):
        return "wandb"
    text = head.decode("utf-8", errors="replace")
    lines = [line for line in text.splitlines() if line.strip()][:SNIFF_LINES]
    if not lines:
        raise UserError(f"{path} is empty: its format cannot be told yet; pass --format ({', '.join(FORMATS)})")
    found = _json_format(path, lines) or _csv_format(lines) or sniff(lines) or table_format(lines)
    if found is None:
        raise NoMetricsYet(f"{path}: no metrics in its first {len(lines)} lines in a format klguard reads (JSON lines, "
                        "trainer_state.json, verl's or TRL's console output, `step: N name: value` lines, CSV or a "
                        "table with a step column); pass --format or see docs/watch.md")
    return found


def _folder_format(path: Path) -> str:
    if (path / "metrics.jsonl").is_file():
        return "klguard"
    if trainer_state_file(path) is not None:
        return "trl"
    if mlflow_runs(path):
        return "mlflow"
    if wandb_file(path) is not None:
        return "wandb"
    if next(path.rglob("events.out.tfevents.*"), None) is not None:
        return "tensorboard"
    raise UserError(f"{path}: no metrics.jsonl, trainer_state.json, MLflow run, W&B run or TensorBoard event file in "
                    "it: pass a log file, or --format")


def _json_format(path: Path, lines: list[str]) -> str | None:
    """klguard / verl / jsonl by the first JSON object line (a legend string line may come first); trl when the
    whole file is one JSON document with a `log_history`."""
    for line in lines[:2]:
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            break
        if isinstance(record, str):
            continue
        if not isinstance(record, dict):
            return None
        if isinstance(record.get("data"), dict) and isinstance(record.get("step"), int):
            return "verl"
        if "step" in record and any(k.startswith(("actor/", "critic/", "guard/", "val-core/")) for k in record):
            return "klguard"
        return "jsonl" if json_step(record) is not None else None
    if lines[0].lstrip().startswith("{"):
        try:
            whole = json.loads(path.read_text(encoding="utf-8"))
        except (ValueError, UnicodeDecodeError):
            return None
        if isinstance(whole, dict) and isinstance(whole.get("log_history"), list):
            return "trl"
    return None


def _csv_format(lines: list[str]) -> str | None:
    """csv when the first rows are a header and rows of as many fields, mostly numbers."""
    if len(lines) < 2 or "," not in lines[0]:
        return None
    rows = list(csv.reader(lines[:5]))
    if len(rows[0]) < 2 or any(len(row) != len(rows[0]) for row in rows[1:]):
        return None
    numbers = sum(_is_number(cell) for row in rows[1:] for cell in row)
    return "csv" if numbers >= len(rows[0]) * (len(rows) - 1) / 2 else None


def _is_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True
