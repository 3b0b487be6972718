"""`torch.profiler` traces of chosen training steps (verl's `global_profiler` with `tool=torch`).

One process runs every role (rollout, reference, critic, reward model, updates), so one trace covers them
all; the trainer's phases (`gen`, `ref`, `values`, `update_actor`, ...) appear in it as labelled ranges
(`klguard.runtime.profiling.phase`). Each profiled window writes, under `global_profiler.save_path`:

- `step_<N>[-<M>]/rank<R>.pt.trace.json.gz`: a Chrome trace (Perfetto, chrome://tracing, TensorBoard's
  profiler plugin);
- `step_<N>[-<M>]/rank<R>.txt`: the operators sorted by self time (device time on a GPU), for a quick look
  without a trace viewer.

Both are written to a temporary name and renamed, so a run stopped mid-write leaves no torn file.
"""

from __future__ import annotations

from contextlib import contextmanager, nullcontext
from pathlib import Path
from typing import TYPE_CHECKING

import torch
from torch.profiler import ProfilerActivity, profile, record_function

from klguard.config.schema import PROFILER_CONTENTS
from klguard.files import atomic_file, atomic_write_text

if TYPE_CHECKING:
    from klguard.config.schema import Config

__all__ = ["CONTENTS", "StepProfiler", "build_profiler", "phase", "window_folder"]

# verl's tool_config.torch.contents; [] means cpu, plus cuda on a GPU run.
CONTENTS = PROFILER_CONTENTS

SUMMARY_ROWS = 40  # operators in the text summary


def phase(name: str):
    """A labelled range in any trace being recorded (a few microseconds when none is)."""
    return record_function(name)


class StepProfiler:
    """Profiles the training steps in `steps` (1-based global steps) on the selected ranks.

    `continuous`: consecutive listed steps share one trace (verl's `profile_continuous_steps`); otherwise each
    listed step gets its own. `contents`: a subset of CONTENTS. Use `with profiler.step(n): ...` around a step.
    """

    def __init__(self, *, steps: list[int] | None, save_path: str | Path, contents: list[str], continuous: bool,
                 rank: int, ranks: list[int] | None, device: torch.device, log=print) -> None:
        self.steps = frozenset(steps or ())
        self.save_path = Path(save_path)
        self.continuous = continuous
        self.rank = rank
        self.enabled = bool(self.steps) and (ranks is None or rank in ranks)
        self.log = log
        wanted = set(contents) or {"cpu", "cuda"}
        self.activities = [ProfilerActivity.CPU] if "cpu" in wanted else []
        if "cuda" in wanted and device.type == "cuda":
            self.activities.append(ProfilerActivity.CUDA)
        if not self.activities:  # "cuda" alone on a CPU run: record the CPU rather than nothing
            self.activities = [ProfilerActivity.CPU]
        self.options = {"profile_memory": "memory" in wanted, "record_shapes": "shapes" in wanted,
                        "with_stack": "stack" in wanted}
        self._active: profile | None = None
        self._first = 0

    def step(self, n: int):
        """Context for training step `n`: recorded when `n` is listed (and this rank profiles)."""
        if not self.enabled or n not in self.steps:
            return nullcontext()
        return self._recorded(n)

    @contextmanager
    def _recorded(self, n: int):
        if self._active is None:
            self._active = profile(activities=self.activities, **self.options)
            self._active.__enter__()
            self._first = n
        failed = True
        try:
            yield
            failed = False
        finally:  # a step that raised ends its window: the trace shows what led up to the error
            if failed or not self.continuous or (n + 1) not in self.steps:
                self._finish(n)

    def close(self) -> None:
        """Stop a trace left open (a run that ended inside a continuous window) and write it."""
        if self._active is not None:
            self._finish(None)

    def _finish(self, n: int | None) -> None:
        prof, self._active = self._active, None
        prof.__exit__(None, None, None)
        folder = window_folder(self.save_path, self._first, n)
        folder.mkdir(parents=True, exist_ok=True)
        trace = folder / f"rank{self.rank}.pt.trace.json.gz"
        with atomic_file(trace) as tmp:  # a .gz name: torch compresses the trace
            prof.export_chrome_trace(str(tmp))
        sort_by = "self_cuda_time_total" if ProfilerActivity.CUDA in self.activities else "self_cpu_time_total"
        table = prof.key_averages().table(sort_by=sort_by, row_limit=SUMMARY_ROWS)
        atomic_write_text(folder / f"rank{self.rank}.txt", table + "\n")
        self.log(f"klguard: profiled step {folder.name.removeprefix('step_')}: {trace}")


def window_folder(save_path: str | Path, first: int, last: int | None = None) -> Path:
    """Where the trace of steps `first`..`last` goes: `step_<first>` or `step_<first>-<last>`."""
    span = str(first) if last in (None, first) else f"{first}-{last}"
    return Path(save_path) / f"step_{span}"


def build_profiler(config: Config, rank: int, device: torch.device, log=print) -> StepProfiler:
    """The run's profiler from `global_profiler` and `actor_rollout_ref.actor.profiler` (it records nothing unless
    `global_profiler.tool=torch`)."""
    glob, role = config.global_profiler, config.actor_rollout_ref.actor.profiler
    ranks = None if role.all_ranks else (list(role.ranks) or [0])
    return StepProfiler(steps=glob.steps if glob.tool == "torch" else None, save_path=glob.save_path,
                        contents=list(role.tool_config.torch.contents), continuous=glob.profile_continuous_steps,
                        rank=rank, ranks=ranks, device=device, log=log)
