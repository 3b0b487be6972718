"""Run several `klguard train` jobs as child processes (in parallel where cores allow) with one
progress bar over all of them. Used by `klguard demo`, `klguard calibrate` and benchmarks/hacking.py.

Each job is a separate process so a crash stays in its log, threads can be split between jobs, and
a job's run directory is an ordinary training run that `klguard report` and `klguard eval` read.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from klguard.errors import UserError
from klguard.runtime.progress import Progress


@dataclass(frozen=True)
class Job:
    label: str
    run_dir: Path
    overrides: tuple[str, ...]
    total_steps: int

    @property
    def log_path(self) -> Path:
        return self.run_dir.with_name(self.run_dir.name + ".log")


def default_parallel() -> int:
    """One job per two cores (torch runs a job best with 1-2 threads at these sizes); one per core below 4."""
    cores = os.cpu_count() or 1
    return cores // 2 if cores >= 4 else cores


def _steps_done(job: Job) -> int:
    metrics = job.run_dir / "metrics.jsonl"
    if not metrics.is_file():
        return 0
    with open(metrics, "rb") as fh:
        lines = fh.read().count(b"\n")
    return min(max(lines - 1, 0), job.total_steps)  # the step-0 validation row is not a step


def _start(job: Job, config_file: str | None, threads: int) -> subprocess.Popen:
    job.run_dir.parent.mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, "-m", "klguard", "train"]
    if config_file:
        cmd += ["--config", config_file]
    cmd += [*job.overrides, f"trainer.default_local_dir={job.run_dir}", "trainer.progress_bar=false"]
    env = {**os.environ, "OMP_NUM_THREADS": str(threads), "TOKENIZERS_PARALLELISM": "false"}
    log = open(job.log_path, "w", encoding="utf-8")  # noqa: SIM115 - closed when the process ends
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env)
    proc.log_file = log  # type: ignore[attr-defined]
    return proc


def run_jobs(jobs: Sequence[Job], *, parallel: int, config_file: str | None = None, desc: str = "klguard",
             show_progress: bool = True, progress_every: int = 0,
             stop_check: Callable[[Job], str | None] | None = None) -> dict[str, str]:
    """Run every job to its end, or until `stop_check(job)` gives a reason to stop it (SIGTERM: the run
    finishes its step, writes a checkpoint and exits 0). Returns those reasons by job label; raises
    UserError naming the log of the first job that failed."""
    # Each job's thread count follows from `parallel` alone, never from how many jobs are left: threads change the
    # float sums, so a job resumed alone must round as it did beside the others.
    threads = max(1, (os.cpu_count() or 1) // max(1, parallel))
    pending, running, failed = list(jobs), [], []
    total = sum(j.total_steps for j in jobs)
    bar = Progress(total, desc=desc, enabled=show_progress, every=progress_every)
    finished_steps, stopping = 0, {}
    try:
        while pending or running:
            while pending and len(running) < parallel:
                job = pending.pop(0)
                running.append((job, _start(job, config_file, threads)))
            still = []
            for job, proc in running:
                if proc.poll() is None:
                    still.append((job, proc))
                    reason = stop_check(job) if stop_check is not None and job.label not in stopping else None
                    if reason:
                        stopping[job.label] = reason
                        bar.write(f"klguard: stopping {job.label} early: {reason}")
                        proc.send_signal(signal.SIGTERM)
                    continue
                proc.log_file.close()
                finished_steps += job.total_steps
                if proc.returncode != 0 and not (job.label in stopping and proc.returncode == -signal.SIGTERM):
                    failed.append((job, proc.returncode))  # (a run told to stop before its loop began dies of it)
            running = still
            bar.update(finished_steps + sum(_steps_done(j) for j, _ in running), ", ".join(j.label for j, _ in running))
            if running:
                time.sleep(1.0)
    finally:
        for _, proc in running:  # interrupted: stop the children, never leave them running
            proc.terminate()
        bar.close()
    if failed:
        job, code = failed[0]
        tail = _last_line(job.log_path)
        raise UserError(f"run {job.label!r} failed (exit {code}): {tail} (log: {job.log_path})")
    return stopping


def _last_line(path: Path) -> str:
    try:
        lines = [ln.strip() for ln in path.read_text(encoding="utf-8", errors="replace").splitlines() if ln.strip()]
    except OSError:
        return "no log"
    return lines[-1] if lines else "empty log"
