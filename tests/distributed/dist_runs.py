"""Helpers for the distributed tests: `klguard train` as one process or as 2 ranks under torchrun."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

TRAIN = [sys.executable, "-m", "klguard", "train"]
TORCHRUN = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", "-m", "klguard",
            "train"]


def run(cmd: list[str], overrides: list[str], run_dir: Path, timeout: float = 240,
        **env: str) -> subprocess.CompletedProcess:
    """`klguard train` (one process or under torchrun) into `run_dir`; one torch thread per process."""
    child_env = dict(os.environ, OMP_NUM_THREADS="1", **env)
    child_env.pop("WORLD_SIZE", None)
    return subprocess.run([*cmd, *overrides, f"trainer.default_local_dir={run_dir}"], env=child_env,
                          capture_output=True, text=True, timeout=timeout, check=False)


def why(proc: subprocess.CompletedProcess) -> str:
    """A failed run's klguard and error lines, then the end of its stderr."""
    keep = [line for line in proc.stderr.splitlines()
            if any(w in line for w in ("klguard:", "Error", "error", "terminate", "what()"))]
    return "\n".join(keep[-30:]) + "\n...\n" + proc.stderr[-1500:]
