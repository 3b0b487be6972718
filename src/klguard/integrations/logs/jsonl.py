"""JSON lines: klguard's `metrics.jsonl` (`{"step": N, ...}`), verl's file logger (`{"step": N, "data": {...}}`)
and any other trainer's flat metric dicts, one per line (the step under a step key: `step`, `_step`,
`global_step`, ...). Values that are numbers in a string are read as numbers; a line that is a JSON string naming
parts (`"mean|std"`) is a legend: later `"52.5|37.7"` values are read as `name/mean` and `name/std`."""

from __future__ import annotations

import json
import math
from pathlib import Path

from klguard.errors import UserError
from klguard.integrations.logs.console import STEP_KEYS
from klguard.integrations.logs.lines import LineLog, Raw, Step

SHAPES = {"klguard": '{"step": N, ...}', "verl": '{"step": N, "data": {...}}',
          "jsonl": '{"step": N, "name": value, ...}'}


def json_step(record: dict) -> int | None:
    for key in STEP_KEYS:
        value = record.get(key)
        if isinstance(value, (int, float)) and not isinstance(value, bool) and value >= 0 and value == int(value):
            return int(value)
    return None


class JsonLines(LineLog):
    """klguard's and verl's files: each line a whole step, returned as soon as it is written. Flat dicts of other
    trainers: lines of one step (training, then its evaluation) are merged."""

    def __init__(self, path: Path, fmt: str) -> None:
        super().__init__(path)
        self.format, self.merge = fmt, fmt == "jsonl"
        self.trainer = None
        self.legend: list[str] | None = None

    def parse(self, number: int, line: str) -> Step | None:
        try:
            record = json.loads(line)
        except json.JSONDecodeError as exc:
            raise UserError(f"{self.path}: line {number} is not JSON ({exc.msg})") from None
        if self.format == "jsonl" and isinstance(record, str) and "|" in record:
            self.legend = record.split("|")
            return None
        if self.format == "verl":
            ok = isinstance(record, dict) and isinstance(record.get("step"), int) and isinstance(record.get("data"),
                                                                                                 dict)
            step, data = (record["step"], record["data"]) if ok else (None, None)
        elif self.format == "klguard":
            ok = isinstance(record, dict) and isinstance(record.get("step"), int)
            step, data = (record["step"], record) if ok else (None, None)
        else:
            step = json_step(record) if isinstance(record, dict) else None
            data = record if step is not None else None
        if data is None:
            raise UserError(f"{self.path}: line {number} is not a {self.format} metrics line {SHAPES[self.format]}")
        return step, self.numbers(data)

    def numbers(self, data: dict) -> Raw:
        out: Raw = {}
        for key, value in data.items():
            if key in STEP_KEYS:
                continue
            if isinstance(value, str) and self.legend and value.count("|") == len(self.legend) - 1:
                for part, text in zip(self.legend, value.split("|"), strict=True):
                    number = _number(text)
                    if number is not None:
                        out[f"{key}/{part}"] = number
                continue
            number = _number(value)
            if number is not None:
                out[key] = number
        return out


def _number(value: object) -> float | None:
    """A JSON value as a float (numbers, numeric strings, JSON's NaN); None for anything else."""
    if isinstance(value, bool) or value is None:
        return None
    if isinstance(value, (int, float)):
        return float(value)
    if isinstance(value, str):
        try:
            number = float(value.strip())
        except ValueError:
            return None
        return number if math.isfinite(number) or value.strip().lower() in ("nan", "inf", "-inf") else None
    return None
