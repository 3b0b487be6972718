"""Rollout under tensor parallelism: generation on the tp shards against a whole replica gathered once a step.

Two gloo ranks on this machine's CPU (one thread each), tensor_parallel_size=2, the built-in task: the same run
with `actor_rollout_ref.rollout.tensor_model_parallel_size=2` (generation on the shards: collectives per token)
and `=1` (each rank refreshes a whole copy from the shards, then generates with no collective), alternated
`--repeats` times so background load hits both alike. Per mode: the median over steps 2.. of `timing_s/gen`
(generation, including the weight gathering), `timing_s/step` and `perf/reshard_share` (the share of the step
spent gathering weights), and the ratio shards/replica. Both must sample the same tokens: the script checks
that the two modes logged the same scores. The anchor of the numerics: the same run as one process, against
which each mode's largest difference over every logged metric (timings aside) is reported, with each rank's
parameter count (`rank_checks.jsonl`, trainer.debug=true). Writes `benchmarks/results/tp_rollout.json`.

    python benchmarks/tp_rollout.py [--repeats 2] [--steps 6] [--response-length 32]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

MODES = {"shards": 2, "replica": 1}  # rollout.tensor_model_parallel_size
TP2 = ["actor_rollout_ref.actor.strategy=fsdp_turbo", "critic.strategy=fsdp_turbo",
       "actor_rollout_ref.actor.fsdp_config.turbo_config.distributed.tensor_parallel_size=2"]
KEYS = ("timing_s/gen", "timing_s/step", "perf/reshard_share")


def overrides(steps: int, response_length: int, cache: Path) -> list[str]:
    return [f"sft.cache_dir={cache}", "trainer.progress_bar=false", "trainer.logger=[jsonl]",
            "trainer.val_before_train=false", "trainer.test_freq=-1", "trainer.save_freq=-1",
            f"trainer.total_training_steps={steps}", "data.train_batch_size=32",
            f"data.max_response_length={response_length}", "actor_rollout_ref.actor.ppo_mini_batch_size=16",
            "trainer.debug=true"]


def train(mode: str, args, cache: Path, out: Path) -> list[dict]:
    """One run's metrics: `mode` under torchrun at tp=2, or (mode "one") the same run as one process."""
    launch = [sys.executable] if mode == "one" else [sys.executable, "-m", "torch.distributed.run", "--standalone",
                                                     "--nproc_per_node=2"]
    layout = [] if mode == "one" else [*TP2, f"actor_rollout_ref.rollout.tensor_model_parallel_size={MODES[mode]}"]
    cmd = [*launch, "-m", "klguard", "train", *overrides(args.steps, args.response_length, cache), *layout,
           f"trainer.default_local_dir={out}"]
    env = dict(os.environ, OMP_NUM_THREADS="1")
    env.pop("WORLD_SIZE", None)
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, check=False)
    if proc.returncode:
        sys.exit(f"tp_rollout: the {mode} run failed:\n{proc.stderr[-2000:]}")
    return list(map(json.loads, (out / "metrics.jsonl").read_text().splitlines()))


def largest_difference(one: list[dict], other: list[dict]) -> tuple[float, str, int, int]:
    """The largest |difference| over every logged metric but timings, where, and how many values were compared."""
    worst, where, count = 0.0, "", 0
    for a, b in zip(one, other, strict=True):
        for key, value in a.items():
            if key.startswith(("timing_s/", "perf/")) or key == "step":
                continue
            count += 1
            if abs(value - b[key]) > worst:
                worst, where = abs(value - b[key]), f"{key} at step {a['step']}"
    return worst, where, count


def rank_params(run_dir: Path) -> list[int]:
    return json.loads((run_dir / "rank_checks.jsonl").read_text().splitlines()[0])["actor_params"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--response-length", type=int, default=32)
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results" / "tp_rollout.json")
    args = parser.parse_args()
    rows: dict[str, list[dict]] = {mode: [] for mode in MODES}
    numerics: dict[str, dict] = {}
    with tempfile.TemporaryDirectory() as tmp:
        one = train("one", args, Path(tmp) / "sft", Path(tmp) / "one")
        for repeat in range(args.repeats):
            for mode in MODES:
                run_dir = Path(tmp) / f"{mode}{repeat}"
                logged = train(mode, args, Path(tmp) / "sft", run_dir)
                rows[mode] += [r for r in logged if r.get("step", 0) > 1]
                if repeat == 0:
                    worst, where, count = largest_difference(one, logged)
                    numerics[mode] = {"largest_difference_from_one_process": worst, "where": where,
                                      "values_compared": count, "actor_params_per_rank": rank_params(run_dir)}
    scores = {mode: [r["critic/score/mean"] for r in part] for mode, part in rows.items()}
    if scores["shards"] != scores["replica"]:
        sys.exit(f"tp_rollout: the two modes sampled differently: {scores}")
    result = {mode: {key: statistics.median(r[key] for r in part) for key in KEYS} for mode, part in rows.items()}
    ratio = result["shards"]["timing_s/gen"] / result["replica"]["timing_s/gen"]
    record = {"machine": f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores", "ranks": 2,
              "tensor_parallel_size": 2, "steps_measured": len(rows["shards"]), **vars(args) | {"out": str(args.out)},
              "median": result, "gen_ratio_shards_over_replica": ratio, "numerics": numerics}
    for mode, values in result.items():
        print(f"{mode:8s} (rollout.tensor_model_parallel_size={MODES[mode]}): gen {values['timing_s/gen']:.3f} s, "
              f"step {values['timing_s/step']:.3f} s, reshard share {values['perf/reshard_share']:.3f}")
    print(f"generation on the shards takes {ratio:.2f}x the replica's time")
    for mode, n in numerics.items():
        print(f"{mode}: largest difference from one process {n['largest_difference_from_one_process']:.2g} "
              f"({n['where']}; {n['values_compared']} values), actor parameters per rank {n['actor_params_per_rank']}")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(record, indent=1) + "\n")


if __name__ == "__main__":
    main()
