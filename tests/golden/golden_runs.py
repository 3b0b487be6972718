"""The golden runs: two short trainings whose `metrics.jsonl` (and `events.jsonl`) must not change, bit for bit,
when the code is reorganised. `python tests/golden/golden_runs.py` regenerates the files beside this one; do that
only in a commit that changes float rounding on purpose, and say so in its message.

Both run with one thread and with MKL's conditional numerical reproducibility (`MKL_CBWR=COMPATIBLE`) and ATen's
portable kernels (`ATEN_CPU_CAPABILITY=default`), so that the numbers do not depend on which SIMD instructions
the CPU has: matrix products and elementwise kernels then take the same code path on any x86 CPU.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).parent
VOLATILE = ("timing_s/", "perf/")  # wall-clock figures: never compared

REPRODUCIBLE_ENV = {
    "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "MKL_CBWR": "COMPATIBLE", "ATEN_CPU_CAPABILITY": "default",
    "ONEDNN_MAX_CPU_ISA": "SSE41", "PYTHONHASHSEED": "0",
}

_COMMON = [
    "sft.steps=30", "sft.batch_size=64", "sft.eval_every=30", "trainer.progress_bar=false",
    "trainer.logger=[jsonl]", "trainer.report=false", "trainer.resume_mode=disable",
    "data.builtin_train_size=64", "data.builtin_val_size=16", "data.max_response_length=16",
]
TRAIN = [sys.executable, "-m", "klguard", "train"]
TORCHRUN = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", "-m", "klguard",
            "train"]

# name -> (command, overrides): the built-in default (GAE, critic, KL in the reward, guard on) for 20 steps, and
# GRPO with the KL loss and shared-prompt forwards on 2 ranks (FSDP2, gloo) for 3 steps.
RUNS: dict[str, tuple[list[str], list[str]]] = {
    "default_20_steps": (TRAIN, [*_COMMON, "trainer.total_training_steps=20", "data.train_batch_size=16",
                                 "actor_rollout_ref.actor.ppo_mini_batch_size=8",
                                 "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=4"]),
    "torchrun_2_ranks_3_steps": (TORCHRUN, [*_COMMON, "trainer.total_training_steps=3", "trainer.test_freq=-1",
                                            "trainer.debug=true", "algorithm.adv_estimator=grpo",
                                            "actor_rollout_ref.rollout.n=4", "actor_rollout_ref.actor.use_kl_loss=true",
                                            "data.train_batch_size=8", "actor_rollout_ref.actor.ppo_mini_batch_size=4",
                                            "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=4"]),
}


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
