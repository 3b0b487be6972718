"""`klguard demo`: klguard's guarded default and verl's default KL settings trained side by side on
the built-in reward-hacking task (same seed, one shared SFT policy), then one report comparing them."""

from __future__ import annotations

import shutil
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from klguard.builtin.recipes import GUARDED_DEFAULT, VERL_DEFAULT
from klguard.builtin.task import prepare_task
from klguard.commands.report import load_run, write_run_report
from klguard.commands.report.summary import text_table
from klguard.commands.sweep import Job, default_parallel, run_jobs
from klguard.config import load_config
from klguard.errors import UserError
from klguard.runtime.progress import format_duration

DEMO_RUNS: tuple[tuple[str, str, tuple[str, ...]], ...] = (
    ("klguard default", "klguard_default", GUARDED_DEFAULT),
    ("verl default KL", "verl_default", VERL_DEFAULT),
)


def fresh_run_dir(path: Path) -> None:
    """Clear a previous demo/calibration run there (only a klguard run directory is ever removed)."""
    if path.exists():
        if not (path / "config.yaml").is_file():
            raise UserError(f"{path} exists and is not a klguard run directory; choose another --out")
        shutil.rmtree(path)
    log_file = path.with_name(path.name + ".log")
    log_file.unlink(missing_ok=True)


VALIDATION_DUMPS = "validation_generations"  # each run's validation responses, for the report's samples panel
REPORT_TITLE = "klguard demo: the guarded default vs verl's default KL on a reward-hacking task"


def run_demo(config_file: str | None, overrides: Sequence[str], out: str | Path, parallel: int | None = None,
             show_progress: bool = True) -> Path:
    """Run both trainings, write `OUT/report.html`, print the comparison; returns the report path."""
    def log(msg: str) -> None:
        print(msg, file=sys.stderr, flush=True)

    started = time.monotonic()
    base = load_config(config_file, overrides).config  # a bad key fails here, before anything runs
    out = Path(out)
    prepare_task(base, log)
    steps = base.trainer.total_training_steps or 0
    jobs = []
    for label, folder, recipe in DEMO_RUNS:
        run_dir = out / folder
        fresh_run_dir(run_dir)
        jobs.append(Job(label, run_dir, (*overrides, *recipe, "trainer.resume_mode=disable",
                                         f"trainer.validation_data_dir={(run_dir / VALIDATION_DUMPS).resolve()}"),
                        steps))
    run_jobs(jobs, parallel=parallel or default_parallel(), config_file=config_file, desc="klguard demo",
             show_progress=show_progress, progress_every=base.trainer.progress_every)
    runs = [load_run(j.run_dir, j.label) for j in jobs]
    report = write_run_report(runs, out / "report.html", title=REPORT_TITLE)
    print(text_table(runs))
    print(f"\nreport: {report.resolve()}")
    print(f"runs:   {', '.join(str(j.run_dir) for j in jobs)}")
    print(f"elapsed: {format_duration(time.monotonic() - started)} wall")
    return report
