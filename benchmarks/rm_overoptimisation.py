"""Does the learned-RM exploit over-optimise the way real reward models do? Gold first rises, then falls.

    python benchmarks/rm_overoptimisation.py                    # SFT policies 0-2 x PPO seeds 1-2, 300 steps
    python benchmarks/rm_overoptimisation.py proxy_reward.learned_rm.init=scratch ...   # another RM recipe

Each run is verl's default KL (fixed 0.001, k1 in the reward, no guard) optimising the built-in learned RM
(`proxy_reward.kind=learned_rm`, its recipe as configured) for `--steps` steps, validated every 10 steps on 256
held-out problems (greedy, gold rule). A run shows the rise-then-fall when its validation gold rises at least
`--rise` above its step-0 value before it first falls `--fall` or more below it (Gao, Schulman and Hilton 2022: gold
against the proxy's optimisation rises, peaks and falls). Also reported: each RM's held-out accuracy on its SFT
policy's own samples (rm_metrics.json). Writes benchmarks/results/rm_overoptimisation.json; the runs are ordinary
`klguard train` directories in OUT/rm_overoptimisation/sft<k>/verl_default_s<seed>/ (`klguard report` reads them).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from klguard.builtin.recipes import VERL_DEFAULT
from klguard.commands.demo import fresh_run_dir
from klguard.commands.report import load_run
from klguard.commands.sweep import Job, default_parallel, run_jobs


def rise_then_fall(steps: list[int], gold: list[float], rise: float, fall: float) -> dict:
    """The curve's step-0 value, its peak before the fall, the first step at or below step 0 - `fall`, and whether
    the peak is at least `rise` above step 0 (a fall that never comes is no rise-then-fall)."""
    start = gold[0]
    fall_at = next((i for i, g in enumerate(gold) if g <= start - fall), None)
    before = gold[: len(gold) if fall_at is None else fall_at]
    peak = max(range(len(before)), key=before.__getitem__)
    return {"step0_gold": start, "peak_gold": before[peak], "peak_step": steps[peak],
            "fall_step": None if fall_at is None else steps[fall_at], "final_gold": gold[-1],
            "low_after_peak": min(gold[peak:]), "rise": before[peak] - start,
            "rise_then_fall": fall_at is not None and before[peak] - start >= rise}


def rm_accuracy(config_overrides: list[str]) -> dict:
    """The learned RM's rm_metrics.json figures for this config (built now if not cached)."""
    from klguard.builtin.task import TASK
    from klguard.config import load_config
    from klguard.ppo.setup import resolve_learned_rm, resolve_model_path

    def log(msg: str) -> None:
        print(msg, file=sys.stderr, flush=True)

    config = load_config(None, config_overrides).config
    folder = Path(resolve_learned_rm(config, TASK, resolve_model_path(config, TASK, log=log), log=log))
    metrics = json.loads((folder / "rm_metrics.json").read_text())
    return {key: metrics[key] for key in ("held_out_accuracy", "train_accuracy", "gold_correct_share")} | {
        "audit_held_out_accuracy": metrics.get("audit", {}).get("held_out_accuracy"), "folder": folder.name}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sft-seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--seeds", type=int, nargs="+", default=[1, 2], help="PPO seeds (trainer.seed)")
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--rise", type=float, default=0.03)
    parser.add_argument("--fall", type=float, default=0.2)
    parser.add_argument("--parallel", type=int, default=default_parallel())
    parser.add_argument("--out", default=str(Path(__file__).parent / "results"))
    parser.add_argument("--summarize-only", action="store_true", help="train nothing: re-read the run directories")
    parser.add_argument("overrides", nargs="*", help="config overrides applied to every run")
    args = parser.parse_args(argv)
    out = Path(args.out)
    base = [*args.overrides, "proxy_reward.kind=learned_rm"]
    rms = {k: rm_accuracy([*base, f"sft.seed={k}"]) for k in args.sft_seeds}
    jobs = [(k, seed, Job(f"sft{k}/verl_default_s{seed}", out / "rm_overoptimisation" / f"sft{k}" /
                          f"verl_default_s{seed}",
                          (*base, f"sft.seed={k}", *VERL_DEFAULT, f"trainer.seed={seed}",
                           f"trainer.total_training_steps={args.steps}", "trainer.resume_mode=disable"), 0))
            for k in args.sft_seeds for seed in args.seeds]
    if not args.summarize_only:
        for *_, job in jobs:
            fresh_run_dir(job.run_dir)
        run_jobs([job for *_, job in jobs], parallel=args.parallel, desc="rm over-optimisation")
    runs = {}
    for k, seed, job in jobs:
        steps, gold = load_run(job.run_dir, job.label).series("val-core/")
        runs[job.label] = rise_then_fall(steps, gold, args.rise, args.fall) | {"sft_seed": k, "seed": seed}
    shown = sum(r["rise_then_fall"] for r in runs.values())
    result = {"overrides": args.overrides, "steps": args.steps, "rise": args.rise, "fall": args.fall,
              "reward_models": {f"sft{k}": v for k, v in rms.items()}, "runs": runs,
              "rise_then_fall": f"{shown} of {len(runs)}"}
    print("| SFT policy | RM held-out accuracy | base rate |")
    print("|---|---|---|")
    for k, rm in rms.items():
        print(f"| {k} | {rm['held_out_accuracy']:.3f} | {rm['gold_correct_share']:.3f} |")
    print(f"\n| run | step-0 gold | peak gold (step) | lowest after the peak | fall to step-0 - {args.fall:.2f} at | "
          "final gold | rise then fall |")
    print("|---|---|---|---|---|---|---|")
    for label, r in runs.items():
        print(f"| {label} | {r['step0_gold']:.3f} | {r['peak_gold']:.3f} ({r['peak_step']}) | "
              f"{r['low_after_peak']:.3f} | {r['fall_step']} | {r['final_gold']:.3f} | "
              f"{'yes' if r['rise_then_fall'] else 'no'} |")
    print(f"\nrise then fall: {result['rise_then_fall']} runs")
    result_file = out / "rm_overoptimisation.json"
    result_file.write_text(json.dumps(result, indent=1))
    print(f"written: {result_file}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
