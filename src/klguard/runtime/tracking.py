"""Metric trackers named as in verl's `trainer.logger`: console, file, tensorboard, wandb, mlflow.

The run directory's `metrics.jsonl` is always written (the report, `klguard watch` and resume read it), whatever
`trainer.logger` lists; `jsonl` there is accepted and changes nothing. `file` writes verl's own format to verl's path.
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import Any, Protocol

from klguard.errors import ConfigError


class Backend(Protocol):
    def log(self, metrics: dict[str, float], step: int) -> None: ...
    def close(self) -> None: ...


def _finite_or_none(value: float) -> float | None:
    return value if math.isfinite(value) else None


class JsonlBackend:
    """One JSON object per step in `metrics.jsonl`; non-finite values are written as null."""

    def __init__(self, run_dir: Path, name: str = "metrics.jsonl") -> None:
        self._file = open(run_dir / name, "a", encoding="utf-8")  # noqa: SIM115 (closed in close())

    def log(self, metrics: dict[str, float], step: int) -> None:
        record = {"step": step, **{k: _finite_or_none(float(v)) for k, v in metrics.items()}}
        self._file.write(json.dumps(record, sort_keys=True) + "\n")
        self._file.flush()

    def close(self) -> None:
        self._file.close()


class VerlFileBackend:
    """verl's `file` logger: `{"step": N, "data": {...}}` lines at $VERL_FILE_LOGGER_PATH, else
    $VERL_FILE_LOGGER_ROOT (default: the working directory)/<project>/<experiment>.jsonl. As verl's, the file
    starts over on each launch; metrics.jsonl keeps the whole run."""

    def __init__(self, project: str, experiment: str) -> None:
        self.path = verl_file_logger_path(project, experiment)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._file = open(self.path, "w", encoding="utf-8")  # noqa: SIM115 (closed in close())

    def log(self, metrics: dict[str, float], step: int) -> None:
        data = {k: _finite_or_none(float(v)) for k, v in metrics.items()}
        self._file.write(json.dumps({"step": step, "data": data}) + "\n")
        self._file.flush()

    def close(self) -> None:
        self._file.close()


def verl_file_logger_path(project: str, experiment: str) -> Path:
    explicit = os.environ.get("VERL_FILE_LOGGER_PATH")
    if explicit:
        return Path(explicit)
    root = Path(os.environ.get("VERL_FILE_LOGGER_ROOT", ".")).expanduser()
    return root / project / f"{experiment}.jsonl"


class TensorBoardBackend:
    def __init__(self, run_dir: Path) -> None:
        from torch.utils.tensorboard import SummaryWriter

        self._writer = SummaryWriter(log_dir=str(run_dir / "tensorboard"))

    def log(self, metrics: dict[str, float], step: int) -> None:
        for key, value in metrics.items():
            self._writer.add_scalar(key, value, step)
        self._writer.flush()

    def close(self) -> None:
        self._writer.close()


class ConsoleBackend:
    """Prints a compact line every `every` steps (the progress bar carries the live view)."""

    KEYS = ("critic/score/mean", "hacking/gold_score", "actor/reward_kl_penalty",
            "actor/reward_kl_penalty_coeff", "response_length/mean")

    def __init__(self, every: int = 10) -> None:
        self.every = every

    def log(self, metrics: dict[str, float], step: int) -> None:
        val = {k: v for k, v in metrics.items() if k.startswith("val-core/")}
        if step % self.every and not val:
            return
        parts = [f"{k}={metrics[k]:.4g}" for k in (*self.KEYS, *sorted(val)) if k in metrics]
        _write_console(f"step {step}: " + " ".join(parts))

    def close(self) -> None:
        pass


class WandbBackend:
    def __init__(self, run_dir: Path, project: str, experiment: str, config: dict[str, Any]) -> None:
        import wandb

        os.environ.setdefault("WANDB_MODE", "offline")  # no network unless the user opts in
        self._run = wandb.init(project=project, name=experiment, dir=str(run_dir), config=config)

    def log(self, metrics: dict[str, float], step: int) -> None:
        self._run.log(metrics, step=step)

    def close(self) -> None:
        self._run.finish()


class MlflowBackend:
    def __init__(self, run_dir: Path, project: str, experiment: str) -> None:
        import mlflow

        if not os.environ.get("MLFLOW_TRACKING_URI"):
            mlflow.set_tracking_uri((run_dir / "mlruns").resolve().as_uri())
        mlflow.set_experiment(project)
        self._run = mlflow.start_run(run_name=experiment)
        self._mlflow = mlflow

    def log(self, metrics: dict[str, float], step: int) -> None:
        safe = {k.replace("@", "_at_"): v for k, v in metrics.items() if math.isfinite(v)}
        self._mlflow.log_metrics(safe, step=step)

    def close(self) -> None:
        self._mlflow.end_run()


def _write_console(line: str) -> None:
    try:
        from tqdm import tqdm

        tqdm.write(line)
    except ImportError:  # pragma: no cover
        print(line)


class Tracking:
    """Fans metrics out to the configured backends."""

    def __init__(self, loggers: list[str], run_dir: Path, *, project: str, experiment: str,
                 config: dict[str, Any] | None = None, write_metrics_file: bool = True) -> None:
        self.first: dict[str, float] = {}  # each metric's first logged value
        self.latest: dict[str, float] = {}  # each metric's latest logged value
        self.backends: list[Backend] = [JsonlBackend(run_dir)] if write_metrics_file else []
        for name in dict.fromkeys(n for n in loggers if n != "jsonl"):
            try:
                self.backends.append(self._make(name, run_dir, project, experiment, config or {}))
            except ImportError as exc:
                raise ConfigError(
                    f"trainer.logger={name!r} needs the package {exc.name!r}: pip install {exc.name}"
                ) from None

    @staticmethod
    def _make(name: str, run_dir: Path, project: str, experiment: str, config: dict) -> Backend:
        if name == "console":
            return ConsoleBackend()
        if name == "file":
            return VerlFileBackend(project, experiment)
        if name == "tensorboard":
            return TensorBoardBackend(run_dir)
        if name == "wandb":
            return WandbBackend(run_dir, project, experiment, config)
        if name == "mlflow":
            return MlflowBackend(run_dir, project, experiment)
        raise ConfigError(f"trainer.logger={name!r} is not a known logger")

    def log(self, metrics: dict[str, float], step: int) -> None:
        for key, value in metrics.items():
            self.first.setdefault(key, value)
        self.latest.update(metrics)
        for backend in self.backends:
            backend.log(metrics, step)

    def close(self) -> None:
        for backend in self.backends:
            backend.close()
