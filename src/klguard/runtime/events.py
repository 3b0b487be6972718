"""`events.jsonl`: one JSON line per guard decision, and the one console line that goes with it; on resume, the
lines a killed run wrote after its checkpoint are dropped from it and from `metrics.jsonl`."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from tqdm import tqdm

from klguard.files import atomic_write_text


def append_event(path: Path, record: dict[str, Any], *, who: str = "klguard guard") -> None:
    """Append `record` (an Action's dict, or a skipped step's) to `path` and print `who [step N] kind: reason`."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a", encoding="utf-8") as fh:
        fh.write(json.dumps(record, sort_keys=True) + "\n")
    tqdm.write(f"{who} [step {record['step']}] {record['kind']}: {record['reason']}")


def truncate_logs(run_dir: Path, step: int, names: tuple[str, ...] = ("metrics.jsonl", "events.jsonl")) -> None:
    """On resume from checkpoint `step`, drop the lines of the JSONL logs `names` that a killed run wrote after it
    (and any torn last line), so every step appears once, as resumed."""
    for name in names:
        path = Path(run_dir) / name
        if not path.is_file():
            continue
        kept = []
        for line in path.read_text(encoding="utf-8").splitlines():
            try:
                record = json.loads(line)
            except ValueError:
                continue
            if isinstance(record, dict) and int(record.get("step", 0)) <= step:
                kept.append(line + "\n")
        atomic_write_text(path, "".join(kept))
