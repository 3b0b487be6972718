"""Helpers for tests that run `klguard train` as a separate process and read its run directory."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch

IGNORED_PREFIXES = ("timing_s/", "perf/")  # wall-clock measurements, different in every run


STARTED: list[subprocess.Popen] = []  # every run start_train launched; conftest.py kills those still running


def start_train(overrides: list[str], stderr_path: Path, **env: str) -> subprocess.Popen:
    """`python -m klguard train ...` with as many torch threads as this process (same float sums)."""
    child_env = dict(os.environ, OMP_NUM_THREADS=str(torch.get_num_threads()), **env)
    with open(stderr_path, "w") as err:
        proc = subprocess.Popen([sys.executable, "-m", "klguard", "train", *overrides], env=child_env,
                                stdout=subprocess.DEVNULL, stderr=err)
    STARTED.append(proc)
    return proc


def stop_started() -> list[int]:
    """Kill the runs start_train launched that are still running (a test failed before it waited for them);
    returns their pids."""
    left = [proc for proc in STARTED if proc.poll() is None]
    for proc in left:
        proc.kill()
        proc.wait(timeout=30)
    STARTED.clear()
    return [proc.pid for proc in left]


def records(run: Path) -> list[dict]:
    """The complete lines of a run's metrics.jsonl: polled while the run writes, the last line may be half there."""
    path = run / "metrics.jsonl"
    if not path.is_file():
        return []
    text = path.read_text()
    return [json.loads(line) for line in text[: text.rfind("\n") + 1].splitlines()]


def comparable(record: dict) -> dict:
    return {k: v for k, v in record.items() if not k.startswith(IGNORED_PREFIXES)}


def wait_until(condition: Callable[[], bool], proc: subprocess.Popen, timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if proc.poll() is not None:
            raise AssertionError(f"the run ended (exit {proc.returncode}) before the awaited point")
        if time.monotonic() > deadline:
            proc.kill()
            raise AssertionError("timed out waiting for the run")
        time.sleep(0.005)
