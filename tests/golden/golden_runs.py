"""The golden runs: two short trainings whose `metrics.jsonl` and `events.jsonl` must not change when the code is
reorganised. `python tests/golden/golden_runs.py` regenerates the files beside this one; do that only in a commit
that changes the numbers on purpose, and say why in its message.

Each CPU rounds differently (AVX-512, AVX2 or plain kernels, MKL's and oneDNN's own choices; no environment setting
made an AMD EPYC reproduce an Intel Xeon's float32 sums), so the comparison is split by what is meant to be exact:
- exact: the number of lines, each line's step and keys, every guard decision (an event's kind, rule, step, metric,
  old and new values) and every metric that counts or decides (lengths, rule-reward scores, hacking rate,
  validation accuracy, alarms, lr, clip, step counters: `EXACT_PREFIXES`);
- within float32 rounding: every other metric, at `tests/tolerances.py` `metric_tol` (a step's rounding, (the
  policy's forward terms + the batch's token positions) x eps32 x the scale of the metric's terms, carried on to
  each later step), and an event's measured value and threshold at the tolerance of the metric it names.
The runs use one thread, so that on one machine they are deterministic; the kernels are whatever the CPU and
`ATEN_CPU_CAPABILITY` pick, so the test checks the tolerances on the machine it runs on.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).parent
VOLATILE = ("timing_s/", "perf/")  # wall-clock figures: never compared

REPRODUCIBLE_ENV = {"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "PYTHONHASHSEED": "0"}

_COMMON = [
    "sft.steps=30", "sft.batch_size=64", "sft.eval_every=30", "trainer.progress_bar=false",
    "trainer.logger=[jsonl]", "trainer.report=false", "trainer.resume_mode=disable",
    "data.builtin_train_size=64", "data.builtin_val_size=16", "data.max_response_length=16",
]
TRAIN = [sys.executable, "-m", "klguard", "train"]
TORCHRUN = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", "-m", "klguard",
            "train"]

# name -> (command, overrides): the built-in default (GAE, critic, KL in the reward, guard on) for 20 steps, and
# GRPO with the KL as a loss only (verl's GRPO recipe) and shared-prompt forwards on 2 ranks (FSDP2, gloo) for 3 steps.
# GRPO with the KL in the reward as well is not a golden: at step 1 the policy is its reference, the per-token
# penalties are rounding noise, and a group whose scores are equal is normalised by the ~1e-8 std of that noise, so
# its advantages (and all that follows) differ between CPUs by percents.
RUNS: dict[str, tuple[list[str], list[str]]] = {
    "default_20_steps": (TRAIN, [*_COMMON, "trainer.total_training_steps=20", "data.train_batch_size=16",
                                 "actor_rollout_ref.actor.ppo_mini_batch_size=8",
                                 "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=4"]),
    "torchrun_2_ranks_3_steps": (TORCHRUN, [*_COMMON, "trainer.total_training_steps=3", "trainer.test_freq=-1",
                                            "trainer.debug=true", "algorithm.adv_estimator=grpo",
                                            "algorithm.use_kl_in_reward=false",
                                            "actor_rollout_ref.rollout.n=4", "actor_rollout_ref.actor.use_kl_loss=true",
                                            "data.train_batch_size=8", "actor_rollout_ref.actor.ppo_mini_batch_size=4",
                                            "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=4"]),
}


# Rollouts a step (prompts x rollout.n) of each run: the rows of metric_tol.
ROLLOUTS = {"default_20_steps": 16, "torchrun_2_ranks_3_steps": 8 * 4}


def train(name: str, out: Path, sft_cache: Path, timeout: float = 600) -> Path:
    """Run golden run `name` into `out` (a new run directory); returns it. Raises with the run's stderr on failure."""
    cmd, overrides = RUNS[name]
    env = dict(os.environ, **REPRODUCIBLE_ENV)
    env.pop("WORLD_SIZE", None)
    proc = subprocess.run([*cmd, *overrides, f"sft.cache_dir={sft_cache}", f"trainer.default_local_dir={out}"],
                          env=env, capture_output=True, text=True, timeout=timeout, check=False)
    if proc.returncode != 0:
        raise RuntimeError(f"golden run {name} failed (exit {proc.returncode}):\n{proc.stderr[-3000:]}")
    return out


def records(path: Path) -> list[dict]:
    """A run's JSON lines without the wall-clock keys."""
    if not path.is_file():
        return []
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return [{k: v for k, v in row.items() if not k.startswith(VOLATILE)} for row in rows]


def golden_files(name: str) -> dict[str, Path]:
    return {"metrics": HERE / f"{name}.metrics.jsonl", "events": HERE / f"{name}.events.jsonl"}


def versions() -> dict[str, str]:
    """The libraries whose kernels and model code the numbers depend on (recorded beside the golden files)."""
    import torch
    import transformers

    return {"torch": torch.__version__, "transformers": transformers.__version__}


VERSIONS_FILE = HERE / "versions.json"


def write_golden(name: str, run_dir: Path) -> None:
    for kind, path in golden_files(name).items():
        rows = records(run_dir / f"{kind}.jsonl")
        path.write_text("".join(json.dumps(r, sort_keys=True) + "\n" for r in rows))


if __name__ == "__main__":
    import tempfile

    with tempfile.TemporaryDirectory() as scratch:
        for run_name in RUNS:
            write_golden(run_name, train(run_name, Path(scratch) / run_name, Path(scratch) / "sft"))
            print(f"wrote {', '.join(str(p) for p in golden_files(run_name).values())}")
    VERSIONS_FILE.write_text(json.dumps(versions(), indent=1, sort_keys=True) + "\n")
