"""`events.jsonl`: one JSON line per guard decision, and the one console line that goes with it."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from tqdm import tqdm


def append_event(path: Path, record: dict[str, Any], *, who: str = "klguard guard") -> None:
    """Append `record` (an Action's dict, or a skipped step's) to `path` and print `who [step N] kind: reason`."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a", encoding="utf-8") as fh:
        fh.write(json.dumps(record, sort_keys=True) + "\n")
    tqdm.write(f"{who} [step {record['step']}] {record['kind']}: {record['reason']}")
