"""The public-log corpus's verdicts pinned (benchmarks/corpus/labels.json, corpus_verdicts.json beside this file): a
change that moves `klguard watch`'s verdict on any corpus log (its exit code, the rule that stops it and the step)
fails here. The committed logs (benchmarks/corpus/) are always judged. The source-only logs are judged where
`python benchmarks/watch_rivals.py --fetch` put them ($KLGUARD_CORPUS_CACHE, else ~/.cache/klguard/corpus) and
skipped where they are absent (CI fetches nothing). The shared logs (01-17, third-party data read in place, never in
this repository) are judged where $KLGUARD_REALLOGS names their folder.

Regenerate after a deliberate change: `python tests/commands/watch/test_corpus_verdicts.py` (rewrites the JSON; the
diff is the moved verdicts, to be explained in the commit)."""

from __future__ import annotations

import contextlib
import io
import json
import os
import sys
from pathlib import Path

import pytest

from klguard.commands.watch import STOP_KINDS, Watch, WatchOptions

ROOT = Path(__file__).resolve().parents[3]
LABELS = ROOT / "benchmarks" / "corpus" / "labels.json"
PINNED = Path(__file__).with_name("corpus_verdicts.json")
LOGS = json.loads(LABELS.read_text(encoding="utf-8"))["logs"]


def _where(location: str) -> Path | None:
    if location == "repo":
        return ROOT / "benchmarks" / "corpus"
    if location == "cache":
        return Path(os.environ.get("KLGUARD_CORPUS_CACHE", "~/.cache/klguard/corpus")).expanduser()
    shared = os.environ.get("KLGUARD_REALLOGS")
    return Path(shared) if shared else None


def verdict(path: Path, events: Path) -> dict:
    """watch's verdict on a log: its exit code and its first stop (rule, step), as `klguard watch LOG` gives them."""
    watch = Watch(path, [], WatchOptions(events=events), say=lambda _line: None)
    with contextlib.redirect_stdout(io.StringIO()):
        code = watch.run()
    stop = next((a for a in watch.decisions if a.kind in STOP_KINDS), None)
    return {"exit": code, "stop": None if stop is None else [stop.kind, stop.rule, stop.step]}


@pytest.mark.parametrize("log", LOGS, ids=[log["id"] for log in LOGS])
def test_the_corpus_verdicts_do_not_move(log, tmp_path):
    folder = _where(log["location"])
    path = None if folder is None else folder / log["file"]
    if path is None or not path.is_file():
        how = "--fetch" if log["location"] == "cache" else "KLGUARD_REALLOGS"
        pytest.skip(f"corpus log {log['id']} is not here ({log['location']}; {how})")
    pinned = json.loads(PINNED.read_text(encoding="utf-8"))[log["id"]]
    assert verdict(path, tmp_path / "events.jsonl") == pinned, log["file"]


def test_every_corpus_log_is_pinned_and_the_committed_ones_are_here():
    pinned = json.loads(PINNED.read_text(encoding="utf-8"))
    assert sorted(pinned) == sorted(log["id"] for log in LOGS)
    assert all((ROOT / "benchmarks" / "corpus" / log["file"]).is_file() for log in LOGS if log["location"] == "repo")


if __name__ == "__main__":  # rewrite the pins from the logs that are here; the others keep theirs
    old = json.loads(PINNED.read_text(encoding="utf-8")) if PINNED.is_file() else {}
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        for log in LOGS:
            folder = _where(log["location"])
            if folder is not None and (folder / log["file"]).is_file():
                old[log["id"]] = verdict(folder / log["file"], Path(tmp) / "events.jsonl")
            elif log["id"] not in old:
                sys.exit(f"corpus log {log['id']} is not here and has no pin")
    PINNED.write_text(json.dumps(dict(sorted(old.items())), indent=1) + "\n", encoding="utf-8")
