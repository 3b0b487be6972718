"""Collect runs of examples/trl/grpo_real_model.py into benchmarks/results/trl_real_model.json (docs/trl.md's table).

    python benchmarks/trl_real_model.py guarded/seed1=trl_real/guarded unguarded/seed1=trl_real/unguarded --add
    python benchmarks/trl_real_model.py guarded_beta0.05/seed1=OUT/guarded:OUT.log --add --note "--beta 0.05"

Each LABEL=DIR[:CONSOLE_LOG] names one run's output folder: its summary.json (held-out figures), trainer_state.json
(the per-step train log) and events.jsonl (the guard's rollbacks and the step each restored: a checkpoint's, or the
reference's). Runs whose events do not name the restored step take it from the console log's "rolled back to" lines.
`--add` keeps the runs already in the JSON (a label given again is replaced); `--note` is stored with each run
collected.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
from importlib.metadata import version
from pathlib import Path

from real_model_speed import _cpu_name

RESULTS = Path(__file__).resolve().parent / "results" / "trl_real_model.json"
TRAIN_LOG_KEYS = ("kl", "rewards/proxy/mean", "rewards/gold/mean", "rewards/hacking/mean", "completions/mean_length",
                  "entropy", "beta")


def machine() -> str:
    """This machine and the libraries of this interpreter (the one the example's runs used)."""
    libraries = ", ".join(f"{name} {version(name)}" for name in ("torch", "transformers", "trl"))
    return f"{os.cpu_count()}-core {_cpu_name()}; {libraries}"


def restored_from_console(log: Path) -> list[int]:
    """The steps restored, from the TRL host's lines "rolled back to OUT/checkpoint-N" and "rolled back to the
    reference policy (step N)"."""
    text = log.read_text(errors="replace")
    return [int(a or b) for a, b in re.findall(r"klguard: rolled back to (?:\S*checkpoint-(\d+)|the reference policy "
                                                 r"\(step (\d+)[;)])", text)]


def collect(folder: Path, console: Path | None) -> dict:
    for name in ("summary.json", "trainer_state.json"):
        if not (folder / name).is_file():
            sys.exit(f"trl_real_model.py: {folder / name} is missing: not a finished grpo_real_model.py run")
    run = json.loads((folder / "summary.json").read_text())
    events = [json.loads(line) for line in (folder / "events.jsonl").read_text().splitlines()] \
        if (folder / "events.jsonl").is_file() else []
    rollbacks = [e for e in events if e.get("kind") == "rollback"]
    run["rollbacks"] = [{"step": e["step"], "rule": e["rule"], "metric": e.get("metric"), "value": e.get("value")}
                        for e in rollbacks]
    if all("restored_step" in e for e in rollbacks):
        run["restored"] = [e["restored_step"] for e in rollbacks]
    else:
        run["restored"] = restored_from_console(console) if console else None
    history = json.loads((folder / "trainer_state.json").read_text())["log_history"]
    run["train_log"] = [{"step": h["step"], **{k: h[k] for k in TRAIN_LOG_KEYS if k in h}}
                        for h in history if "kl" in h]
    return run


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("runs", nargs="+", help="LABEL=DIR[:CONSOLE_LOG]")
    ap.add_argument("--out", type=Path, default=RESULTS)
    ap.add_argument("--add", action="store_true", help="keep the runs already in --out")
    ap.add_argument("--note", help="how these runs differ from the example's defaults")
    args = ap.parse_args(argv)
    report = json.loads(args.out.read_text()) if args.add and args.out.is_file() else {
        "command": "python examples/trl/grpo_real_model.py --seed N --out OUT [--beta B] (one thread per run, two "
                   "runs side by side), collected by benchmarks/trl_real_model.py", "machine": machine(), "runs": {}}
    for spec in args.runs:
        label, _, where = spec.partition("=")
        folder, _, console = where.partition(":")
        if not label or not folder:
            sys.exit(f"trl_real_model.py: {spec!r} is not LABEL=DIR[:CONSOLE_LOG]")
        run = collect(Path(folder), Path(console) if console else None)
        if args.note:
            run["note"] = args.note
        report["runs"][label] = run
        print(f"{label}: gold {run['gold']:.3f}, hacked {run['hacking_rate']:.2f}, length "
              f"{run['response_length']:.1f}, final beta {run['final_beta']:.3g}, rollbacks "
              f"{[(r['step'], r['rule']) for r in run['rollbacks']]} -> {run['restored']}, "
              f"{run['train_runtime_s'] / 60:.0f} min")
    args.out.write_text(json.dumps(report, indent=1) + "\n")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
