"""A newcomer's first run and calibration: `klguard demo`, then `klguard calibrate` with and without early stopping.

1. A fresh HOME and an empty cache, then `klguard demo` (wall and CPU seconds, its log's size, the two runs'
   figures beside the ranges README gives for the shipped policy).
2. For each seed: `klguard calibrate` with the defaults (early stopping, grid extension), then the anchor: every
   target that sweep trained (the grid and the targets it added), each to the end, no early stopping. Reported:
   CPU seconds of each, the recommended target_kl, the fit's peak, the final gold of the recommended run, the
   ratio early / full, and what the default grid alone would have recommended without extension. The target: the
   same recommendation, or one whose trained gold is within 0.01 of the full sweep's, at <= 1/3 of its CPU time.

Writes benchmarks/results/first_run.json.

    python benchmarks/first_run.py [--seeds 1 2] [--workdir DIR] [--skip-demo] [--set key=value ...]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from klguard.commands.report import load_run

RESULTS = Path(__file__).resolve().parent / "results" / "first_run.json"
GOLD = "val-core/"
# README's ranges for `klguard demo` on the shipped policy (PPO seeds 1-3, this project's 2-core machine)
README_RANGES = {
    "klguard default": {"final_gold": (0.92, 0.97), "sampled_hacking": (0.14, 0.23)},
    "verl default KL": {"final_gold": (0.0, 0.57), "sampled_hacking": (0.92, 0.99)},
}


def timed(cmd: list[str], env: dict[str, str], log: Path) -> dict:
    """Run `cmd` with its output in `log`; wall seconds and CPU seconds of it and its children."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.monotonic()
    with open(log, "w") as fh:
        code = subprocess.run(cmd, env=env, stdout=fh, stderr=subprocess.STDOUT).returncode
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return {"exit": code, "wall_s": round(time.monotonic() - start, 1), "cpu_s": round(cpu, 1),
            "log_bytes": log.stat().st_size}


def fresh_env(home: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "KLGUARD_CACHE"}
    return env | {"HOME": str(home), "XDG_CACHE_HOME": str(home / ".cache")}


def demo(work: Path, extra: list[str]) -> dict:
    home = work / "home"
    home.mkdir(parents=True)
    out = work / "demo"
    result = timed([sys.executable, "-m", "klguard", "demo", "--out", str(out), *extra], fresh_env(home),
                   work / "demo.log")
    result["sft_cache"] = sorted(p.name for p in (home / ".cache" / "klguard").glob("sft-*"))  # empty: it shipped
    runs = {}
    for label, folder in (("klguard default", "klguard_default"), ("verl default KL", "verl_default")):
        run = load_run(out / folder, label)
        figures = {"final_gold": run.last(GOLD), "sampled_hacking": run.mean_last("hacking/rate", 10),
                   "final_beta": run.last("actor/reward_kl_penalty_coeff"), "guard_actions": run.action_count}
        within = {k: lo <= figures[k] <= hi for k, (lo, hi) in README_RANGES[label].items()}
        runs[label] = {**figures, "readme_ranges": README_RANGES[label], "within_readme": within}
    return result | {"runs": runs}


def calibrate(work: Path, seed: int, grid: list[float] | None, extra: list[str]) -> dict:
    """The defaults (grid None), or every target of `grid` trained to the end."""
    out = work / f"calibrate_seed{seed}_{'early' if grid is None else 'full'}"
    flags = [] if grid is None else ["calibrate.early_stop=false", "calibrate.extend_grid=false",
                                     f"calibrate.grid=[{','.join(f'{t:g}' for t in grid)}]",
                                     f"calibrate.budget_steps={10**9}"]
    cmd = [sys.executable, "-m", "klguard", "calibrate", f"trainer.seed={seed}", f"calibrate.output_dir={out}",
           f"trainer.default_local_dir={out / 'unused'}", *flags, *extra]
    result = timed(cmd, {**os.environ}, out.with_suffix(".log"))
    cal = json.loads((out / "calibration.json").read_text())
    target = cal["recommendation"]["target_kl"]
    gold = None
    if target is not None:
        gold = load_run(out / f"target_kl_{target:g}").last(GOLD)
    return result | {
        "output_dir": str(out), "recommended_target_kl": target, "recommended_final_gold": gold,
        "basis": cal["recommendation"]["basis"],
        "fit_peak_kl": _peak(cal["fit"]), "fit_r2": cal["fit"]["r2"] if cal["fit"] else None,
        "steps_trained": cal["steps_trained"], "runs_cpu_s": round(cal["cpu_s"], 1), "bracket": cal["bracket"],
        "points": cal["points"], "added_targets": cal["added_targets"],
    }


def grid_alone(full: dict, grid: list[float], metric: str = GOLD, unit: str = "token_mean") -> dict:
    """What the full sweep's runs on the default grid alone recommend (klguard calibrate before extension)."""
    from klguard.commands.calibrate.analysis import fit_gao, fit_points, recommend, summarize

    runs = {t: load_run(Path(full["output_dir"]) / f"target_kl_{t:g}") for t in grid}
    points = [summarize(run, t, metric, unit) for t, run in runs.items()]
    fit = fit_gao([pt for run in runs.values() for pt in fit_points(run, metric, unit)])
    rec = recommend(points, fit, max_hacking_rate=0.1)
    return {"recommended_target_kl": rec.target_kl, "basis": rec.basis,
            "hacking": {f"{p.target_kl:g}": p.hacking_rate for p in points},
            "final_gold": {f"{p.target_kl:g}": p.final_score for p in points}}


def _peak(fit: dict | None) -> float | None:
    import math

    if not fit or fit["b"] <= 0:
        return None
    return math.exp(2 * (fit["a"] / fit["b"] - 1))


def compare(full: dict, early: dict) -> dict:
    same = full["recommended_target_kl"] == early["recommended_target_kl"]
    close = (full["recommended_final_gold"] is not None and early["recommended_final_gold"] is not None
             and early["recommended_final_gold"] >= full["recommended_final_gold"] - 0.01)
    ratio = early["cpu_s"] / full["cpu_s"] if full["cpu_s"] else None
    return {"same_target": same, "gold_within_0.01": close, "cpu_ratio": round(ratio, 3) if ratio else None,
            "meets_target": bool((same or close) and ratio is not None and ratio <= 1 / 3)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--workdir", type=Path, default=None)
    parser.add_argument("--skip-demo", action="store_true")
    parser.add_argument("--set", nargs="*", default=[], metavar="KEY=VALUE",
                        help="overrides for every command (a quick check: trainer.total_training_steps=4)")
    args = parser.parse_args()
    work = args.workdir or Path(tempfile.mkdtemp(prefix="klguard-first-run-"))
    work.mkdir(parents=True, exist_ok=True)
    results: dict = {"machine": {"cpus": os.cpu_count()}, "workdir": str(work), "overrides": args.set}
    if not args.skip_demo:
        results["demo"] = demo(work, args.set)
        print(json.dumps({k: v for k, v in results["demo"].items() if k != "runs"}), flush=True)
        for label, figures in results["demo"]["runs"].items():
            print(f"  {label}: {json.dumps(figures)}", flush=True)
    results["calibrate"] = {}
    for seed in args.seeds:
        early = calibrate(work, seed, None, args.set)
        grid = sorted({p["target_kl"] for p in early["points"]})
        full = calibrate(work, seed, grid, args.set)
        default_grid = [t for t in grid if t not in early["added_targets"]]
        results["calibrate"][str(seed)] = {"early_stop": early, "full": full, "comparison": compare(full, early),
                                           "default_grid_alone": grid_alone(full, default_grid)}
        for name, run in (("full", full), ("early", early)):
            print(f"seed {seed} {name:>5}: cpu {run['cpu_s']:.0f} s, wall {run['wall_s']:.0f} s, steps "
                  f"{run['steps_trained']}, target {run['recommended_target_kl']}, gold {run['recommended_final_gold']}"
                  f", fit peak {run['fit_peak_kl']}, {run['bracket']}", flush=True)
        print(f"seed {seed}: {json.dumps(results['calibrate'][str(seed)]['comparison'])}; default grid alone: "
              f"{results['calibrate'][str(seed)]['default_grid_alone']['basis']}", flush=True)
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(results, indent=1) + "\n")
    print(f"wrote {RESULTS}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
