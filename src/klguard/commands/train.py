"""`klguard train`: a trainer, its trackers, a live progress bar and the closing summary.

Under torchrun (`torchrun --nproc_per_node=N -m klguard train ...`) every rank trains; only rank 0 logs,
shows the progress bar and writes the reports. Whatever ends the run, the rank leaves the process group.
"""

from __future__ import annotations

import json
import sys

from klguard.builtin.task import task_for
from klguard.config import Config, config_to_dict
from klguard.distributed import barrier, shutdown
from klguard.ppo.trainer import PPOTrainer
from klguard.runtime.events import truncate_logs
from klguard.runtime.preemption import Preemption
from klguard.runtime.progress import Progress
from klguard.runtime.tracking import Tracking

SUMMARY_KEYS = (
    ("val-core gold acc", "val-core/"), ("proxy score", "hacking/proxy_score"), ("gold score", "hacking/gold_score"),
    ("hacking rate", "hacking/rate"), ("response length", "response_length/mean"),
    ("KL per token", "actor/reward_kl_penalty"), ("KL coefficient", "actor/reward_kl_penalty_coeff"),
)


def _pick(metrics: dict[str, float], key: str) -> float | None:
    if key.endswith("/"):
        found = [v for k, v in sorted(metrics.items()) if k.startswith(key) and "/acc/" in k]
        return found[0] if found else None
    return metrics.get(key)


def _progress_callback(bar: Progress):
    def update(step: int, metrics: dict[str, float]) -> None:
        bar.update(step, {
            "gold": f"{metrics.get('hacking/gold_score', float('nan')):.2f}",
            "proxy": f"{metrics.get('critic/score/mean', float('nan')):.2f}",
            "kl": f"{metrics.get('actor/reward_kl_penalty', float('nan')):.4f}",
            "beta": f"{metrics.get('actor/reward_kl_penalty_coeff', float('nan')):.3g}",
            "len": f"{metrics.get('response_length/mean', float('nan')):.1f}",
        })
    return update


def train(config: Config) -> dict[str, float]:
    """Run PPO as configured; returns the last step's metrics."""
    try:
        last = _train(config)
        barrier()  # ranks leave together: a rank that exits while another still talks to it aborts that one
        return last
    finally:
        shutdown()


def _train(config: Config) -> dict[str, float]:
    bar: Progress | None = None

    def log(msg: str) -> None:
        if bar is not None:
            bar.write(msg)
        else:
            print(msg, file=sys.stderr, flush=True)

    trainer = PPOTrainer(config, task=task_for(config), log=log)
    main = trainer.dist.is_main
    if trainer.state.step > 0 and main:  # resumed: a killed run's lines after the checkpoint are redone
        truncate_logs(trainer.run_dir, trainer.state.step)
    tracker = Tracking(config.trainer.logger if main else [], trainer.run_dir, project=config.trainer.project_name,
                       experiment=config.trainer.experiment_name, config=config_to_dict(config),
                       write_metrics_file=main)
    bar = Progress(trainer.total_steps, desc="klguard train", initial=trainer.state.step,
                   enabled=config.trainer.progress_bar and main, every=config.trainer.progress_every)
    try:
        with Preemption() as preemption:
            last = trainer.fit(tracker, progress=_progress_callback(bar), preemption=preemption)
    finally:
        bar.close()
        tracker.close()
    if not main:
        return last
    _print_summary(tracker.first, tracker.latest, trainer)
    (trainer.run_dir / "summary.json").write_text(json.dumps({"first": tracker.first, "last": tracker.latest},
                                                             indent=1, sort_keys=True))
    if config.trainer.report:
        from klguard.commands.report import load_run, write_run_report

        report = write_run_report([load_run(trainer.run_dir)], trainer.run_dir / "report.html",
                                  f"klguard run {trainer.run_dir.name}")
        print(f"  report: {report}")
    if preemption.requested and trainer.state.step < trainer.total_steps:
        latest = trainer.checkpoints.manager.latest()
        print(f"klguard: stopped by {preemption.signal_name} after step {trainer.state.step}; latest checkpoint: "
              f"{latest}; rerun the same command to resume (trainer.resume_mode=auto)", file=sys.stderr)
    return last


def _print_summary(first: dict[str, float], last: dict[str, float], trainer: PPOTrainer) -> None:
    def fmt(value: float | None) -> str:
        return "-" if value is None else f"{value:.4g}"

    print(f"\n{'metric':<22}{'start':>12}{'end':>12}")
    for label, key in SUMMARY_KEYS:
        print(f"{label:<22}{fmt(_pick(first, key)):>12}{fmt(_pick(last, key)):>12}")
    print(f"\nrun directory: {trainer.run_dir.resolve()}")
    print(f"  metrics: {trainer.run_dir / 'metrics.jsonl'}   config: {trainer.run_dir / 'config.yaml'}")
    latest = trainer.checkpoints.manager.latest()
    if latest is not None:
        print(f"  latest checkpoint: {latest}")
