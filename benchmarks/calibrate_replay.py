"""Replay `klguard calibrate`'s early stopping and grid extension over a sweep whose runs all went to the end.

Given a calibrate output folder of full runs (first_run.py's `calibrate_seedN_full`, or any
`klguard calibrate calibrate.early_stop=false` folder with enough targets), it replays the stopping rules
step by step on the recorded metrics, for several settings of `calibrate.stop_hacking_rate`,
`calibrate.stop_hacking_validations` and `calibrate.budget_steps`, and prints what each setting would have
recommended and the steps it would have trained, beside the full sweep's recommendation. No training: it
costs seconds, so a stopping rule can be chosen on recorded runs (and then checked on a fresh seed).
Replayed runs see each other synchronously (the real sweep's other runs may be ahead or behind).

    python benchmarks/calibrate_replay.py FOLDER [FOLDER ...] [--grid 0.005 0.01 ...]
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from klguard.commands.calibrate.analysis import fit_gao, fit_points, recommend, summarize
from klguard.commands.calibrate.early_stop import StopRule, next_targets, stop_reason
from klguard.commands.report import load_run
from klguard.commands.report.runs import RunRecord
from klguard.config import load_config

METRIC, UNIT = "val-core/", "token_mean"
SETTINGS = [(rate, n) for rate in (0.1, 0.2, 0.25, 0.3, 0.35, 0.4) for n in (2, 3)]


def cut(run: RunRecord, step: int) -> RunRecord:
    return RunRecord(run.label, run.path, [r for r in run.rows if r["step"] <= step], run.events)


def _recommend(done: dict[float, RunRecord], stopped: dict[float, int], max_hacking: float) -> float | None:
    points = [summarize(done[t], t, METRIC, UNIT) for t in sorted(done) if t not in stopped]
    fit = fit_gao([pt for run in done.values() for pt in fit_points(run, METRIC, UNIT)])
    return recommend(points, fit, max_hacking).target_kl


def replay(full: dict[float, RunRecord], grid: list[float], rule: StopRule | None, budget: int, steps: int,
           parallel: int = 2, min_gain: float = 0.01) -> dict:
    done: dict[float, RunRecord] = {}
    stopped: dict[float, int] = {}

    def run(targets):
        for target in targets:
            record, stop = full[target], None
            for step in (s for s in record.series(METRIC)[0] if rule is not None and s > 0):
                others = [cut(full[o], step) for o in done]
                if stop_reason(cut(record, step), others, rule):
                    stop = step
                    break
            done[target] = cut(record, stop + 1) if stop else record  # SIGTERM: the run ends its next step
            if stop:
                stopped[target] = stop

    run(grid)
    start = full[grid[0]].series(METRIC)[1][0]
    found = ""
    while True:
        points = [summarize(done[t], t, METRIC, UNIT) for t in sorted(done)]
        step = next_targets(points, start, rule.max_hacking_rate if rule else 0.1, min_gain, count=parallel,
                            stopped=set(stopped))
        new = [t for t in step.targets if t not in done]
        found = step.reason
        affordable = (budget - sum(r.steps for r in done.values())) // steps
        if not new or rule is None or affordable < 1:
            found += "; budget spent" if new and affordable < 1 else ""
            break
        missing = [t for t in new[:affordable] if t not in full]
        if missing:
            found = f"needs target_kl {missing}, not in the folder"
            break
        run(new[:affordable])
    target = _recommend(done, stopped, rule.max_hacking_rate if rule else 0.1)
    return {"recommended": target, "final_gold": done[target].last(METRIC) if target else None,
            "steps": sum(r.steps for r in done.values()), "targets": sorted(done), "stopped_at": stopped,
            "found": found}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("folders", type=Path, nargs="+")
    parser.add_argument("--grid", type=float, nargs="+", default=None, help="the starting grid (default: klguard's)")
    args = parser.parse_args()
    defaults = load_config().config
    grid = args.grid or list(defaults.calibrate.grid)
    steps, max_hacking = defaults.trainer.total_training_steps, defaults.calibrate.max_hacking_rate
    for folder in args.folders:
        full = {float(d.name.removeprefix("target_kl_")): load_run(d) for d in sorted(folder.glob("target_kl_*"))
                if (d / "metrics.jsonl").is_file()}
        every = _recommend(full, {}, max_hacking)
        print(f"{folder}: {len(full)} full runs; all of them, to the end, recommend {every} "
              f"(final gold {full[every].last(METRIC) if every else None}), {steps * len(full)} steps")
        for rate, validations in SETTINGS:
            for budget_factor in (1, 2):
                rule = StopRule(METRIC, rate, validations, defaults.calibrate.stop_behind, max_hacking)
                result = replay(full, grid, rule, budget_factor * len(grid) * steps, steps)
                print(f"  stop_hacking_rate={rate:g} stop_hacking_validations={validations} budget={budget_factor}x "
                      f"grid: {json.dumps(result)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
