"""The reward-hacking benchmark: KL settings trained on the built-in demo over several seeds.

    python benchmarks/hacking.py                 # 3 seeds, every contender (~30 min on 2 cores)
    python benchmarks/hacking.py --seeds 1 2 --only guarded verl_default seed_recipe
    python benchmarks/hacking.py --out /tmp/lrm --seeds 1 2 proxy_reward.kind=learned_rm   # the learned-RM exploit

Each contender is a config override set (klguard/recipes.py); every run is an ordinary
`klguard train` in benchmarks/results/hacking/<contender>_s<seed>/ (`klguard report` reads it).
Writes benchmarks/results/hacking.json and prints a table of means over seeds (and each seed).

Figures per run: final and best validation gold (greedy, held-out), the rollout hacking rate and the
validation hacking rate at the end, KL per token and per sequence, response length (rollout figures
are means of the last 10 steps: one step is only 64 samples).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

from klguard.commands.demo import fresh_run_dir, prepare_builtin_policy
from klguard.commands.recipes import GUARDED_DEFAULT, SEED_RECIPE, VERL_DEFAULT, fixed_coef
from klguard.commands.report import load_run
from klguard.commands.report.summary import summary_value
from klguard.commands.sweep import Job, default_parallel, run_jobs


def _controller(kind: str, target: float) -> tuple[str, ...]:
    if kind == "adaptive":  # the seed's adaptive recipe at this target
        key = "algorithm.kl_ctrl.target_kl="
        return tuple(f"{key}{target}" if o.startswith(key) else o for o in SEED_RECIPE)
    return ("algorithm.kl_ctrl.type=pid", f"algorithm.kl_ctrl.target_kl={target}", "algorithm.kl_ctrl.kl_coef=0.05",
            "algorithm.kl_penalty=low_var_kl", "guard.enable=false")


CONTENDERS: dict[str, tuple[str, ...]] = {
    "verl_default": VERL_DEFAULT,
    "seed_recipe": SEED_RECIPE,
    "fixed_0.01": fixed_coef(0.01),
    "fixed_0.03": fixed_coef(0.03),
    "fixed_0.1": fixed_coef(0.1),
    "fixed_0.3": fixed_coef(0.3),
    "fixed_0.5": fixed_coef(0.5),
    "fixed_1.0": fixed_coef(1.0),
    "guarded": GUARDED_DEFAULT,
    "guarded_warmup0": (*GUARDED_DEFAULT, "guard.warmup_kl_coef=0"),  # the seed's warm-up: beta 0 for 20% of steps
    # the seed's claim: target_kl 0.015 hacks ~40% less than 0.03, with a better true score
    # (adaptive at 0.015 is seed_recipe itself)
    "adaptive_0.03": _controller("adaptive", 0.03),
    "pid_0.015": _controller("pid", 0.015),
    "pid_0.03": _controller("pid", 0.03),
}

FIGURES = (
    ("final_gold", "val-core/", "last"), ("best_gold", "val-core/", "best"),
    ("hacking_rate", "hacking/rate", "tail"), ("val_hacking_rate", "val-aux/*", "last"),
    ("kl_per_token", "actor/reward_kl_penalty", "tail"), ("kl_per_seq", "actor/kl_seq_sum", "tail"),
    ("length", "response_length/mean", "tail"), ("final_kl_coef", "actor/reward_kl_penalty_coeff", "last"),
)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3])
    parser.add_argument("--only", nargs="+", choices=sorted(CONTENDERS), help="run only these contenders")
    parser.add_argument("--parallel", type=int, default=default_parallel())
    parser.add_argument("--out", default=str(Path(__file__).parent / "results"))
    parser.add_argument("--markdown", action="store_true", help="also print the per-seed table as Markdown")
    parser.add_argument("--summarize-only", action="store_true",
                        help="train nothing: re-read the run directories already in OUT/hacking/")
    parser.add_argument("overrides", nargs="*", help="config overrides applied to every run (e.g. trainer.total_"
                        "training_steps=100)")
    args = parser.parse_args(argv)
    out = Path(args.out)
    names = args.only or list(CONTENDERS)

    from klguard.config import load_config

    base = load_config(None, args.overrides).config
    jobs = [Job(f"{name}_s{seed}", out / "hacking" / f"{name}_s{seed}",
                (*args.overrides, *CONTENDERS[name], f"trainer.seed={seed}", "trainer.resume_mode=disable"),
                base.trainer.total_training_steps or 0) for seed in args.seeds for name in names]
    if not args.summarize_only:
        prepare_builtin_policy(base, lambda m: print(m, file=sys.stderr))
        for job in jobs:
            fresh_run_dir(job.run_dir)
        run_jobs(jobs, parallel=args.parallel, desc="hacking benchmark")

    per_run = {}
    for job in jobs:
        run = load_run(job.run_dir, job.label)
        per_run[job.label] = {key: summary_value(run, metric, how) for key, metric, how in FIGURES}
        per_run[job.label]["guard_actions"] = run.action_count
        per_run[job.label]["steps"] = run.steps
    result_file = out / "hacking.json"
    result = _merge(result_file, per_run, args.overrides)
    result_file.write_text(json.dumps(result, indent=1))
    _print_table(result, names, args.seeds)
    _print_claims(result)
    if args.markdown:
        _print_markdown(result)
    print(f"\nwritten: {result_file} (runs of earlier invocations with the same overrides are kept)")
    return 0


def _merge(result_file: Path, per_run: dict, overrides: list[str]) -> dict:
    """Add this invocation's runs to the file's (same overrides only), recompute means per contender."""
    runs: dict = {}
    if result_file.is_file():
        old = json.loads(result_file.read_text())
        if old.get("overrides") == overrides:
            runs = old.get("runs", {})
    runs.update(per_run)
    by_name: dict[str, list[dict]] = {}
    for label, figures in runs.items():
        by_name.setdefault(label.rsplit("_s", 1)[0], []).append(figures)
    keys = (*[f[0] for f in FIGURES], "guard_actions", "steps")
    means = {name: {key: _mean([r[key] for r in rs]) for key in keys} | {"seeds": len(rs)}
             for name, rs in by_name.items()}
    return {"overrides": overrides, "contenders": {n: list(CONTENDERS[n]) for n in by_name if n in CONTENDERS},
            "runs": dict(sorted(runs.items())), "means": means, "claims": _claims(means)}


SEED_CLAIM_PAIRS = {"adaptive": ("seed_recipe", "adaptive_0.03"), "pid": ("pid_0.015", "pid_0.03")}


def _claims(means: dict) -> dict:
    """The seed's claim, per controller: hacking at target 0.015 relative to 0.03 (it says about -40%)."""
    out = {}
    for controller, (low, high) in SEED_CLAIM_PAIRS.items():
        if low in means and high in means:
            h_low, h_high = means[low]["hacking_rate"], means[high]["hacking_rate"]
            change = (h_low - h_high) / h_high if h_low is not None and h_high else None
            out[controller] = {"hacking_0.015": h_low, "hacking_0.03": h_high, "relative_change": change,
                               "final_gold_0.015": means[low]["final_gold"],
                               "final_gold_0.03": means[high]["final_gold"]}
    return out


def _print_claims(result: dict) -> None:
    for controller, c in result["claims"].items():
        print(f"seed's claim, {controller}: hacking {_fmt(c['hacking_0.015'])} at target 0.015 vs "
              f"{_fmt(c['hacking_0.03'])} at 0.03 (relative change {_fmt(c['relative_change'])}; the seed: about "
              f"-0.4); final gold {_fmt(c['final_gold_0.015'])} vs {_fmt(c['final_gold_0.03'])}")


def _mean(values):
    values = [v for v in values if v is not None]
    return statistics.fmean(values) if values else None


def _print_table(result: dict, names: list[str], seeds: list[int]) -> None:
    means, runs = result["means"], result["runs"]
    cols = [f[0] for f in FIGURES] + ["guard_actions", "steps", "seeds"]
    print("\nmeans over the seeds on record")
    print(f"{'contender':<16}" + "".join(f"{c:>17}" for c in cols))
    for name in means:
        print(f"{name:<16}" + "".join(f"{_fmt(means[name][c]):>17}" for c in cols))
    print("\nthis invocation, per seed: final_gold / best_gold / hacking_rate / val_hacking_rate")
    for name in names:
        cells = "  ".join(
            f"s{s}: {_fmt(r['final_gold'])}/{_fmt(r['best_gold'])}/{_fmt(r['hacking_rate'])}/"
            f"{_fmt(r['val_hacking_rate'])}" for s in seeds for r in [runs[f"{name}_s{s}"]])
        print(f"{name:<16}{cells}")


def _print_markdown(result: dict) -> None:
    """Per contender: each seed's final / best gold and hacking rates, then the mean."""
    print("\n| contender | final gold | best gold | hacking (rollouts) | hacking (val) | length | KL/token |")
    print("|---|---|---|---|---|---|---|")
    by_name: dict[str, list[tuple[str, dict]]] = {}
    for label, r in result["runs"].items():
        name, seed = label.rsplit("_s", 1)
        by_name.setdefault(name, []).append((seed, r))
    for name, runs in by_name.items():
        m = result["means"][name]
        cells = [" / ".join(_fmt(r[key]) for _, r in runs) + f" (mean {_fmt(m[key])})"
                 for key in ("final_gold", "best_gold", "hacking_rate", "val_hacking_rate")]
        print(f"| {name} | " + " | ".join(cells) + f" | {_fmt(m['length'])} | {_fmt(m['kl_per_token'])} |")


def _fmt(value) -> str:
    return "-" if value is None else f"{value:.4g}"


if __name__ == "__main__":
    sys.exit(main())
