"""Helpers for the distributed tests: `klguard train` as one process or as ranks under torchrun, and the
comparison of two runs' metrics within float32 rounding (tests/tolerances.py)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from klguard.builtin.char_tokenizer import build_char_tokenizer
from klguard.builtin.tiny import build_tiny_llama
from tolerances import forward_terms, metric_tol

TRAIN = [sys.executable, "-m", "klguard", "train"]
TORCHRUN = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", "-m", "klguard",
            "train"]
TORCHRUN_4 = [arg.replace("--nproc_per_node=2", "--nproc_per_node=4") for arg in TORCHRUN]
COMPARED = ("critic/score/mean", "actor/pg_loss", "actor/reward_kl_penalty_coeff", "actor/reward_kl_penalty",
            "critic/vf_loss", "actor/grad_norm")
POLICY_TERMS = forward_terms(build_tiny_llama(build_char_tokenizer()))  # the SFT policy (and critic) of every run
ROWS = 16  # rollouts a step: 16 prompts (dist_base), or 4 prompts x rollout.n = 4


def run(cmd: list[str], overrides: list[str], run_dir: Path, timeout: float = 240,
        **env: str) -> subprocess.CompletedProcess:
    """`klguard train` (one process or under torchrun) into `run_dir`; one torch thread per process."""
    child_env = dict(os.environ, OMP_NUM_THREADS="1", **env)
    child_env.pop("WORLD_SIZE", None)
    return subprocess.run([*cmd, *overrides, f"trainer.default_local_dir={run_dir}"], env=child_env,
                          capture_output=True, text=True, timeout=timeout, check=False)


def trained(cmd: list[str], overrides: list[str], run_dir: Path) -> Path:
    """`run`, asserting that it succeeded; returns the run directory."""
    proc = run(cmd, overrides, run_dir)
    assert proc.returncode == 0, why(proc)
    return run_dir


def why(proc: subprocess.CompletedProcess) -> str:
    """A failed run's klguard and error lines, then the end of its stderr."""
    keep = [line for line in proc.stderr.splitlines()
            if any(w in line for w in ("klguard:", "Error", "error", "terminate", "what()"))]
    return "\n".join(keep[-30:]) + "\n...\n" + proc.stderr[-1500:]


def records(run_dir: Path) -> dict[int, dict]:
    return {r["step"]: r for r in map(json.loads, (run_dir / "metrics.jsonl").read_text().splitlines())}


def same_metrics(ref: Path, other: Path, steps: range, keys: tuple[str, ...] | None = None) -> float:
    """Assert that run `other` logged run `ref`'s `keys` (default COMPARED; () = every metric but timings) at
    `steps` within float32 rounding; returns the largest difference seen."""
    a, b = records(ref), records(other)
    worst = 0.0
    for step in steps:
        every = [k for k in a[step] if not k.startswith(("timing_s/", "perf/"))]
        names = every if keys == () else keys or COMPARED
        assert set(names) <= b[step].keys(), (step, set(names) - b[step].keys())
        for key in names:
            tol = metric_tol(list(a.values()), key, step, ROWS, POLICY_TERMS)
            assert b[step][key] == pytest.approx(a[step][key], rel=0, abs=tol), (step, key)
            worst = max(worst, abs(b[step][key] - a[step][key]))
    return worst


def cut_back(src: Path, dst: Path, step: int) -> Path:
    """A copy of run `src` as if it had stopped after checkpoint `step`."""
    shutil.copytree(src, dst)
    for folder in dst.glob("global_step_*"):
        if int(folder.name.rsplit("_", 1)[1]) > step:
            shutil.rmtree(folder)
    (dst / "latest_checkpointed_iteration.txt").write_text(str(step))
    return dst
