"""W&B offline run folders (`wandb/offline-run-<time>-<id>/run-<id>.wandb`, or a finished online run's folder):
the history records of the run's `.wandb` file, decoded with wandb's own protobuf messages (`klguard[logs]`).

wandb 0.31 no longer ships a Python reader of that file (its service, written in Go, reads it), so its framing is
read here as wandb documents it: a 7-byte header (`:W&B`, magic, version), then LevelDB log records (checksum,
length, type FULL/FIRST/MIDDLE/LAST) in 32 KiB blocks, each whole record one serialised `Record`."""

from __future__ import annotations

import json
import struct
from pathlib import Path

from klguard.errors import UserError
from klguard.integrations.logs.lines import Step, StepBuffer

BLOCK, HEADER = 32768, 7
FULL, FIRST, MIDDLE, LAST = 1, 2, 3, 4


def wandb_file(path: Path) -> Path | None:
    """The newest `.wandb` file of a run folder, a `wandb/` folder of runs, or the file itself."""
    if path.is_file():
        return path if path.suffix == ".wandb" else None
    return max(path.rglob("*.wandb"), key=lambda p: p.stat().st_mtime, default=None)


def records(data: bytes, path: Path) -> tuple[list[bytes], int]:
    """The whole records in `data` (a .wandb file's bytes so far) and how many bytes they span."""
    if data[:4] != b":W&B":
        raise UserError(f"{path}: not a W&B run file (no :W&B header)")
    out, part, pos, done = [], b"", HEADER, HEADER
    while True:
        if BLOCK - pos % BLOCK < HEADER:
            pos += BLOCK - pos % BLOCK  # a block's tail too short for a header is padding
        if pos + HEADER > len(data):
            return out, done
        _, length, kind = struct.unpack("<IHB", data[pos:pos + HEADER])
        if kind == 0 or pos + HEADER + length > len(data):
            return out, done
        chunk, pos = data[pos + HEADER:pos + HEADER + length], pos + HEADER + length
        part = chunk if kind in (FULL, FIRST) else part + chunk
        if kind in (FULL, LAST):
            out.append(part)
            done = pos


class WandbLog:
    """The `history` rows of a W&B run (`wandb.log`), by their `_step`."""

    format, trainer = "wandb", None

    def __init__(self, path: Path) -> None:
        try:
            from wandb.proto import wandb_internal_pb2
        except ImportError:
            raise UserError(f"{path}: reading a W&B run needs wandb (pip install 'wandb>=0.31,<0.32')") from None
        self.path, self.file = path, wandb_file(path)
        if self.file is None:
            raise UserError(f"{path}: no .wandb run file in it")
        self.message = wandb_internal_pb2.Record
        self._read = 0
        self.buffer = StepBuffer()

    def poll(self, final: bool = False) -> list[Step]:
        data = self.file.read_bytes()
        found, _ = records(data, self.file)
        for blob in found[self._read:]:
            record = self.message()
            record.ParseFromString(blob)
            if record.WhichOneof("record_type") != "history":
                continue
            row = {}
            for item in record.history.item:
                key = item.key or "/".join(item.nested_key)
                value = json.loads(item.value_json)
                if isinstance(value, (int, float)) and not isinstance(value, bool):
                    row[key] = float(value)
            step = record.history.step.num if record.history.HasField("step") else row.get("_step")
            for key, value in row.items():
                if not key.startswith("_") and step is not None:
                    self.buffer.add(int(step), key, value)
        self._read = len(found)
        return self.buffer.ready(final)
