"""The calibration sweep's runs on disk, one run directory per target_kl under calibrate.output_dir.

Beside each run's metrics a status file records the overrides it was started with and how it ended
(finished, or stopped early and why). A rerun keeps finished runs (and stopped ones, while early stopping
is on), resumes a killed one from its last checkpoint (klguard train's resume is bit for bit; a stopped
one too, when early stopping was turned off), and starts afresh any run whose overrides changed. The
`calibrate.*` keys are the sweep's, not a run's: a rerun with a longer grid trains only the new targets.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from klguard.commands.calibrate.early_stop import StopRule, stop_reason
from klguard.commands.demo import fresh_run_dir
from klguard.commands.report import load_run
from klguard.commands.report.runs import RunRecord
from klguard.commands.sweep import Job, run_jobs
from klguard.config.schema import CalibrateConfig
from klguard.errors import UserError

STATUS = "calibrate_status.json"


def sweep_overrides(cal, target: float) -> tuple[str, ...]:
    """The controller settings of one sweep run (and of the recommended command)."""
    return (f"algorithm.kl_ctrl.type={cal.controller}", f"algorithm.kl_ctrl.target_kl={target}",
            f"algorithm.kl_ctrl.kl_coef={cal.kl_coef}", f"algorithm.kl_ctrl.horizon={cal.horizon}")


def _read_status(run_dir: Path) -> dict | None:
    try:
        return json.loads((run_dir / STATUS).read_text())
    except (OSError, ValueError):
        return None


def _write_status(run_dir: Path, overrides: Sequence[str], state: str, reason: str | None = None) -> None:
    run_dir.mkdir(parents=True, exist_ok=True)
    tmp = run_dir / f".{STATUS}.tmp"
    tmp.write_text(json.dumps({"overrides": list(overrides), "state": state, "reason": reason}, indent=1))
    tmp.replace(run_dir / STATUS)


@dataclass
class SweepRuns:
    out: Path
    overrides: tuple[str, ...]  # the user's but calibrate.*, shared by every run
    cal: CalibrateConfig
    steps: int
    config_file: str | None
    rule: StopRule | None  # None: no early stopping
    targets: list[float] = field(default_factory=list)
    stopped: dict[float, str] = field(default_factory=dict)
    kept: list[float] = field(default_factory=list)  # runs a previous invocation finished
    _cache: dict[Path, tuple[int, RunRecord]] = field(default_factory=dict)
    _target: dict[str, float] = field(default_factory=dict)  # job label -> its target_kl
    _checked: dict[float, int] = field(default_factory=dict)  # target -> rows its last stop check saw

    def job(self, target: float) -> Job:
        label = f"target_kl={target:g}"
        self._target[label] = target
        return Job(label, self.out / f"target_kl_{target:g}",
                   (*self.overrides, *sweep_overrides(self.cal, target), "guard.enable=false",
                    "trainer.resume_mode=auto"), self.steps)

    def _prepare(self, job: Job) -> bool:
        """True when the job must run; keeps a finished run (and a stopped one while early stopping is on),
        resumes a killed one (and a stopped one when it is off), clears any other."""
        status = _read_status(job.run_dir)
        same = status is not None and status["overrides"] == list(job.overrides)
        if same and (status["state"] == "finished" or (status["state"] == "stopped" and self.rule is not None)):
            if status.get("reason"):
                self.stopped[self._target[job.label]] = status["reason"]
            self.kept.append(self._target[job.label])
            return False
        if not (same and any(job.run_dir.glob("global_step_*"))):
            if status is not None:  # ours, from other arguments or killed before its first checkpoint
                shutil.rmtree(job.run_dir)
            fresh_run_dir(job.run_dir)
            _write_status(job.run_dir, job.overrides, "running")
        return True

    def run(self, targets: Sequence[float], *, parallel: int, show_progress: bool, progress_every: int) -> None:
        jobs = {t: self.job(t) for t in targets}
        self.targets += [t for t in targets if t not in self.targets]
        todo = [job for job in jobs.values() if self._prepare(job)]
        check = self._stop_check if self.rule is not None else None
        stopped = run_jobs(todo, parallel=parallel, config_file=self.config_file, desc="klguard calibrate",
                           show_progress=show_progress, progress_every=progress_every, stop_check=check)
        for target, job in jobs.items():
            if job in todo:
                reason = stopped.get(job.label)
                if reason:
                    self.stopped[target] = reason
                _write_status(job.run_dir, job.overrides, "stopped" if reason else "finished", reason)

    def record(self, target: float) -> RunRecord | None:
        """The run's metrics as far as they are written (re-read only when the file grew)."""
        job = self.job(target)
        try:
            size = (job.run_dir / "metrics.jsonl").stat().st_size
        except OSError:
            return None
        cached = self._cache.get(job.run_dir)
        if cached is None or cached[0] != size:
            try:
                cached = (size, load_run(job.run_dir, job.label))
            except UserError:  # a line half written: read it next time
                return cached[1] if cached else None
            self._cache[job.run_dir] = cached
        return cached[1]

    def records(self) -> list[tuple[float, RunRecord]]:
        return [(t, r) for t in sorted(self.targets) if (r := self.record(t)) is not None]

    def steps_trained(self) -> int:
        return sum(r.steps for _, r in self.records())

    def _stop_check(self, job: Job) -> str | None:
        target = self._target[job.label]
        run = self.record(target)
        # checked again once the run logs a new step (others' new rows then count, at most a step late)
        if run is None or self._checked.get(target) == len(run.rows):
            return None
        self._checked[target] = len(run.rows)
        others = [r for t, r in self.records() if t != target]
        return stop_reason(run, others, self.rule)
