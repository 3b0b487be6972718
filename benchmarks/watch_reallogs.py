"""`klguard watch` over the public training logs in ../shared/reallogs/ (third-party data, read in place, never
copied into the repository): what it read and what it decided, beside each log's label from INDEX.md.

    python benchmarks/watch_reallogs.py                 # ../shared/reallogs relative to the repository root
    python benchmarks/watch_reallogs.py /path/to/reallogs

Each log is watched as a new user would run `klguard watch LOG` (format told from the content, names no map knows
read by meaning, the external hosts' defaults), with `--map` only where a log's own names need it (MAPS: none).
Prints one table per half of the corpus (tune, held-out: `half` in benchmarks/corpus/labels.json; thresholds are set
on the tune half only), one row per log, and writes benchmarks/results/watch_reallogs.json. Decision events go to a
temporary folder. A log with a `hacking/ref_nll` input (the log of a perplexity under the base model), a logged-only
signal by default, is watched twice more with `ref_nll` among `guard.hacking_signals` (REF_NLL_RUNS): as it is, and
with the KL hard limit out of reach, to see the step the signal alone would stop at.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import platform
import re
import sys
import tempfile
import time
from pathlib import Path

from klguard.commands.watch import EXIT_BLIND, STOP_KINDS, Watch, WatchOptions
from klguard.commands.watch_rules import KL, VAL
from klguard.errors import UserError
from klguard.guard.config import DEFAULT_HACKING_SIGNALS, EXTERNAL_HOST_DEFAULTS
from klguard.guard.inputs import matches
from klguard.guard.signals import ENTROPY, GRAD_NORM, LENGTH, PPO_KL, REF_NLL, SCORE

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_LOGS = ROOT.parent / "shared" / "reallogs"
OUT = ROOT / "benchmarks" / "results" / "watch_reallogs.json"
CORPUS_LABELS = ROOT / "benchmarks" / "corpus" / "labels.json"
HALVES = {"tune": "tune half (thresholds chosen here)", "heldout": "held-out half (judged only)"}
MAPS: dict[str, list[str]] = {}
"""`--map` items per log number (none: every log's inputs are found by a map or by meaning)."""
SHORT = {KL[0]: "kl", KL[1]: "kl", PPO_KL: "ppo_kl", SCORE: "score", GRAD_NORM: "grad", LENGTH: "len",
         ENTROPY: "ent", REF_NLL: "ref_nll", VAL: "val"}
WITH_REF_NLL = f"guard.hacking_signals=[{','.join([*DEFAULT_HACKING_SIGNALS, 'ref_nll'])}]"
REF_NLL_RUNS = {"with_ref_nll": [WITH_REF_NLL], "with_ref_nll_no_kl_hard": [WITH_REF_NLL, "guard.kl_hard_limit=1e9"]}
"""The extra watches of a log with a `hacking/ref_nll` input: their overrides."""


def labels(index: Path) -> dict[str, str]:
    """INDEX.md's table: log number -> label."""
    rows = re.findall(r"^\| (\d\d) \| [^|]+ \| ([^|]+) \|$", index.read_text(encoding="utf-8"), re.M)
    return {number: label.strip() for number, label in rows}


def halves() -> dict[str, str]:
    """labels.json's half of each log, by its number (logs the corpus does not list: '?')."""
    logs = json.loads(CORPUS_LABELS.read_text(encoding="utf-8"))["logs"]
    return {log["id"]: log["half"] for log in logs}


def watch_one(log: Path, events: Path, overrides: list[str] | None = None) -> dict:
    number = log.name[:2]
    said: list[str] = []
    watch = Watch(log, overrides or [], WatchOptions(events=events, names=MAPS.get(number, [])), say=said.append)
    try:
        with contextlib.redirect_stdout(io.StringIO()) as printed:  # the decision lines, also in `said` and events
            code = watch.run()
    except UserError as exc:
        return {"log": log.name, "format": "-", "steps": 0, "exit": 2, "decision": f"refused: {exc}"}
    stop = next((a for a in watch.decisions if a.kind in STOP_KINDS), None)
    inputs = []
    inferred = set(watch.reader.inference.renames.values())
    for name, short in SHORT.items():
        if matches(watch.names, name) and short not in inputs and short + "*" not in inputs:
            read_by_meaning = matches(inferred, name) and not matches(watch.names - inferred, name)
            inputs.append(short + ("*" if read_by_meaning else ""))
    counted = " (entries)" if watch.reader.counted else ""
    return {"log": log.name, "format": watch.reader.format, "trainer": watch.reader.trainer,
            "steps": watch.read, "steps_counted_by_entry": watch.reader.counted, "span": watch.span,
            "steps_judged": watch.steps, "inputs": inputs, "exit": code, "map": MAPS.get(number, []),
            "by_meaning": watch.reader.inference.renames,
            "decision": _calm(watch, code) if stop is None else f"{stop.kind} @{stop.step}{counted} ({stop.rule})",
            "stop": None if stop is None else {"kind": stop.kind, "step": stop.step, "rule": stop.rule,
                                              "metric": stop.metric, "value": stop.value,
                                              "threshold": stop.threshold, "reason": stop.reason},
            "said": said[1:] + printed.getvalue().splitlines(),  # less the first line: paths of this machine
            "ref_nll_runs": {key: _decision(log, events, extra) for key, extra in REF_NLL_RUNS.items()}
            if matches(watch.names, REF_NLL) and overrides is None else None}


def _decision(log: Path, events: Path, overrides: list[str]) -> dict:
    """A REF_NLL_RUNS watch of `log`: its overrides, decision and stop."""
    row = watch_one(log, events, overrides)
    return {"overrides": overrides, "decision": row["decision"], "stop": row.get("stop")}


def machine() -> str:
    info = Path("/proc/cpuinfo")
    lines = info.read_text().splitlines() if info.is_file() else []
    model = next((line.split(":", 1)[1].strip() for line in lines if line.startswith("model name")), None)
    return f"{os.cpu_count()} cores, {model or platform.machine()}"


def _calm(watch: Watch, code: int) -> str:
    if code == EXIT_BLIND:
        return "blind (no rule could fire)"
    window = watch.session.guard.cfg.baseline_window
    return "calm" + (f" (too short: {watch.read} steps <= {window})" if watch.read <= window else "")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("logs", nargs="?", default=str(DEFAULT_LOGS), help="the folder of logs (with INDEX.md)")
    parser.add_argument("--out", default=str(OUT))
    args = parser.parse_args(argv)
    folder = Path(args.logs)
    if not (folder / "INDEX.md").is_file():
        print(f"watch_reallogs: {folder} has no INDEX.md (pass the reallogs folder)", file=sys.stderr)
        return 2
    label = labels(folder / "INDEX.md")
    rows = []
    started = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        for log in sorted(p for p in folder.iterdir() if p.name != "INDEX.md"):
            row = watch_one(log, Path(tmp) / f"{log.name}.events.jsonl")
            row["label"] = label.get(log.name[:2], "?")
            rows.append(row)
    seconds = time.perf_counter() - started
    half = halves()
    for row in rows:
        row["half"] = half.get(row["log"][:2], "?")
    head = (f"| {'log':<3} | {'format':<12} | {'steps read':<14} | {'guard inputs found':<40} | {'decision':<40} "
            "| INDEX label |")
    for name, title in HALVES.items():
        print(f"\n{title}:")
        print(head)
        print("|" + "|".join("-" * (len(cell)) for cell in head.split("|")[1:-1]) + "|")
        for row in (r for r in rows if r["half"] == name):
            span = row.get("span")
            steps = f"{row['steps']}" + (f" ({span[0]}-{span[1]})" if span else "")
            print(f"| {row['log'][:2]:<3} | {row['format']:<12} | {steps:<14} | {', '.join(row.get('inputs', [])):<40} "
                  f"| {row['decision']:<40} | {row['label']} |")
    print("(* an input found by meaning: a name no trainer's map knows)")
    for row in rows:
        for key, run in (row.get("ref_nll_runs") or {}).items():
            print(f"{row['log'][:2]} {key} ({' '.join(run['overrides'])}): {run['decision']}")
    result = {"command": "python benchmarks/watch_reallogs.py", "logs": os.path.relpath(folder, ROOT),
              "seconds": round(seconds, 1),
              "machine": machine(),
              "python": platform.python_version(),
              "external_host_defaults": EXTERNAL_HOST_DEFAULTS, "rows": rows}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=1) + "\n")
    print(f"{len(rows)} logs in {seconds:.1f} s; written {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
