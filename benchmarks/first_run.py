"""A newcomer's first run and calibration: `klguard demo`, then `klguard calibrate` with and without early stopping.

1. A fresh HOME and an empty cache, then `klguard demo` (wall and CPU seconds, its log's size, the two runs'
   figures beside the ranges README gives for the shipped policy).
2. For each seed: `klguard calibrate` with the defaults (early stopping, grid extension), then the anchor: every
   target that sweep trained (the grid and the targets it added), each to the end, no early stopping. Reported:
   CPU seconds of each, the recommended target_kl, the fit's peak, the final gold of the recommended run, the
   ratio early / full, and what the default grid alone would have recommended without extension. The target: the
   same recommendation, or one whose trained gold is within 0.01 of the full sweep's, at <= 1/3 of its CPU time.

With --from-clone the demo runs as README's first command does on a fresh machine: a `git clone` of this
repository, a new venv, `pip install torch==2.13.0 -e CLONE` timed (pip's own cache as it is), then `klguard demo`
from that venv. --skip-calibrate keeps the file's calibration section as it is and writes the demo's.

Writes benchmarks/results/first_run.json.

    python benchmarks/first_run.py [--seeds 1 2] [--workdir DIR] [--skip-demo] [--set key=value ...]
    python benchmarks/first_run.py --from-clone --skip-calibrate     # README's figures: install and demo timed
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

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results" / "first_run.json"
DEMO_SEEDS = ROOT / "benchmarks" / "results" / "hacking_demo_seeds.json"
GOLD = "val-core/"
SLACK = 0.02  # one demo run against the range of the demo's contenders over PPO seeds 1-3


def seed_ranges() -> dict[str, dict[str, tuple[float, float]]]:
    """The demo's two contenders over PPO seeds (docs/results.md's demo table), widened by SLACK: where one run of
    `klguard demo` should land on any machine."""
    runs = json.loads(DEMO_SEEDS.read_text())["runs"]
    out = {}
    for label, contender in (("klguard default", "guarded"), ("verl default KL", "verl_default")):
        seeds = [r for name, r in runs.items() if name.rsplit("_s", 1)[0] == contender]
        out[label] = {}
        for figure, key in (("final_gold", "final_gold"), ("sampled_hacking", "hacking_rate")):
            values = [r[key] for r in seeds]
            out[label][figure] = (round(min(values) - SLACK, 3), round(max(values) + SLACK, 3))
    return out


def timed(cmd: list[str], env: dict[str, str], log: Path) -> dict:
    """Run `cmd` with its output in `log`; wall seconds and CPU seconds of it and its children."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.monotonic()
    with open(log, "w") as fh:
        code = subprocess.run(cmd, env=env, stdout=fh, stderr=subprocess.STDOUT).returncode
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    wall = time.monotonic() - start
    # the machine's 1-minute load average at the end: near the command's own CPU share (cpu / wall) on an idle
    # machine, higher where something else ran beside it
    return {"exit": code, "wall_s": round(wall, 1), "cpu_s": round(cpu, 1), "log_bytes": log.stat().st_size,
            "load_1min_at_end": round(os.getloadavg()[0], 2), "own_cpu_share": round(cpu / wall, 2)}


def fresh_env(home: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "KLGUARD_CACHE"}
    return env | {"HOME": str(home), "XDG_CACHE_HOME": str(home / ".cache")}


def install_from_clone(work: Path) -> tuple[dict, str]:
    """README's first command's install on a fresh clone in a new venv; its timing and the venv's python."""
    clone, venv = work / "clone", work / "venv"
    subprocess.run(["git", "clone", "-q", str(ROOT), str(clone)], check=True)
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    result = timed([str(venv / "bin" / "pip"), "install", "torch==2.13.0", "-e", str(clone)], {**os.environ},
                   work / "install.log")
    commit = subprocess.run(["git", "-C", str(clone), "rev-parse", "--short", "HEAD"], capture_output=True,
                            text=True, check=True).stdout.strip()
    return result | {"commit": commit}, str(venv / "bin" / "python")


def demo(work: Path, extra: list[str], python: str = sys.executable) -> dict:
    home = work / "home"
    home.mkdir(parents=True)
    out = work / "demo"
    result = timed([python, "-m", "klguard", "demo", "--out", str(out), *extra], fresh_env(home),
                   work / "demo.log")
    result["sft_cache"] = sorted(p.name for p in (home / ".cache" / "klguard").glob("sft-*"))  # empty: it shipped
    runs, ranges = {}, seed_ranges()
    for label, folder in (("klguard default", "klguard_default"), ("verl default KL", "verl_default")):
        run = load_run(out / folder, label)
        figures = {"final_gold": run.last(GOLD), "sampled_hacking": run.mean_last("hacking/rate", 10),
                   "final_beta": run.last("actor/reward_kl_penalty_coeff"), "guard_actions": run.action_count}
        within = {k: lo <= figures[k] <= hi for k, (lo, hi) in ranges[label].items()}
        runs[label] = {**figures, "seed_ranges": ranges[label], "within_seed_ranges": within}
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


def _cpu_model() -> str:
    info = Path("/proc/cpuinfo")
    names = [line.split(":", 1)[1].strip() for line in info.read_text().splitlines()
             if line.startswith("model name")] if info.exists() else []
    return names[0] if names else "unknown"


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
    parser.add_argument("--from-clone", action="store_true", help="install a fresh clone into a new venv (timed) "
                        "and run the demo from it, as README's first command does")
    parser.add_argument("--skip-calibrate", action="store_true", help="keep the results file's calibration section")
    parser.add_argument("--set", nargs="*", default=[], metavar="KEY=VALUE",
                        help="overrides for every command (a quick check: trainer.total_training_steps=4)")
    args = parser.parse_args()
    work = args.workdir or Path(tempfile.mkdtemp(prefix="klguard-first-run-"))
    work.mkdir(parents=True, exist_ok=True)
    results: dict = {"machine": {"cpus": os.cpu_count(), "cpu": _cpu_model()}, "workdir": str(work),
                     "overrides": args.set}
    if args.skip_calibrate:
        results = json.loads(RESULTS.read_text()) | {k: v for k, v in results.items() if k != "machine"}
        results["demo_machine"] = {"cpus": os.cpu_count(), "cpu": _cpu_model()}
    if not args.skip_demo:
        python = sys.executable
        if args.from_clone:
            results["install"], python = install_from_clone(work)
            print(json.dumps({"install": results["install"]}), flush=True)
        results["demo"] = demo(work, args.set, python)
        print(json.dumps({k: v for k, v in results["demo"].items() if k != "runs"}), flush=True)
        for label, figures in results["demo"]["runs"].items():
            print(f"  {label}: {json.dumps(figures)}", flush=True)
    if not args.skip_calibrate:
        results["calibrate"] = {}
    for seed in [] if args.skip_calibrate else args.seeds:
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
