"""`klguard watch PATH [--follow]`: the guard in advisory mode over any trainer's log as it is written.

It reads verl's file logger, TensorBoard event files (verl, OpenRLHF, TRL), TRL's trainer_state.json or klguard's
metrics.jsonl (klguard.integrations.trainer_logs), feeds each step to KLGuard, prints one line per decision and
writes them to an events file. It acts on nothing: the exit code says what the guard decided, so that
`klguard watch --follow LOG || scancel $JOB` stops a run the guard would have rolled back or paused:
0 the guard stayed calm (advice such as a higher KL coefficient may have been printed), 3 it decided to roll
back or pause (watching stops there: the run's later steps are ones the guard would not have let happen),
2 bad input. The guard runs in a session (klguard.guard.session) whose host acts on nothing.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from klguard.config.restricted import load_restricted
from klguard.errors import UserError
from klguard.guard import Action, AdvisoryHost, GuardSession, KLGuard
from klguard.integrations.trainer_logs import LogReader, detect_format, open_log
from klguard.runtime.events import append_event

EXIT_CALM, EXIT_STOP = 0, 3
STOP_KINDS = ("rollback", "pause")
KEY_PREFIXES = ("guard.", "algorithm.kl_ctrl.", "trainer.total_training_steps")
"""The keys `watch` takes: the guard's, the KL controller's (its target and whether one steers the KL) and the
run length (the guard's warm-up is a share of it)."""
TRAINER_EVENTS = ("klguard", "trl")  # formats whose trainer may write its own events.jsonl beside the log


@dataclass
class WatchOptions:
    follow: bool = False
    fmt: str | None = None
    events: Path | None = None
    interval: float = 1.0  # seconds between polls with --follow
    idle_exit: float | None = None  # with --follow: stop (calm) once the log has not grown for this long


def events_path(reader: LogReader) -> Path:
    """events.jsonl beside the log; watch_events.jsonl where the trainer itself may write events.jsonl."""
    folder = reader.path if reader.path.is_dir() else reader.path.parent
    return folder / ("watch_events.jsonl" if reader.format in TRAINER_EVENTS else "events.jsonl")


class Watch:
    """One log, one advisory guard. `run()` returns the exit code."""

    def __init__(self, path: str | Path, overrides: Sequence[str], options: WatchOptions,
                 say: Callable[[str], None] = print) -> None:
        config = load_restricted(overrides, KEY_PREFIXES, who="klguard watch",
                                 elsewhere="the watched trainer's own settings stay in its launch line")
        kc = config.algorithm.kl_ctrl
        guard = KLGuard(config.guard, total_steps=config.trainer.total_training_steps or 0,
                        target_kl=kc.target_kl, kl_controlled=kc.type != "fixed")
        self.host = _WatchHost()
        self.session = GuardSession(guard, self.host)
        self.path, self.options, self.say = Path(path).expanduser(), options, say
        self.reader: LogReader | None = None
        self.last_step: int | None = None
        self.decisions: list[Action] = []

    def run(self) -> int:
        if not self.path.exists():
            raise UserError(f"{self.path} does not exist")
        self.reader = self._open()
        events = self.host.events = self.options.events or events_path(self.reader)
        events.parent.mkdir(parents=True, exist_ok=True)
        events.write_text("")  # each watch judges the whole log again
        self.say(f"klguard watch: {self.reader.path} ({self.reader.format}); decisions -> {events}")
        grown = time.monotonic()
        while True:
            steps = self.reader.poll(final=not self.options.follow)
            stop = self._take(steps)
            if stop is not None:
                return stop
            if not self.options.follow:
                return self._calm()
            grown = time.monotonic() if steps else grown
            idle = self.options.idle_exit
            if idle is not None and time.monotonic() - grown > idle:
                return self._take(self.reader.poll(final=True)) or self._calm()
            time.sleep(self.options.interval)

    def _open(self) -> LogReader:
        """The reader; with --follow an empty log (its trainer not started yet) is waited for."""
        while True:
            try:
                return open_log(self.path, self.options.fmt)
            except UserError:
                if not self.options.follow or self.options.fmt or not _empty(self.path):
                    raise
            time.sleep(self.options.interval)

    def _take(self, steps: list[tuple[int, dict[str, float]]]) -> int | None:
        for step, metrics in steps:
            if self.last_step is not None and step <= self.last_step:
                continue  # a relaunched trainer logs its resumed steps again
            if self.last_step is None and step > 0:
                self._decide(0, {})  # no step-0 validation in this log: the guard starts without a baseline
            self.last_step = step
            if self._decide(step, metrics):
                self.say(f"klguard watch: the guard would stop the run at step {step}; exit {EXIT_STOP}")
                return EXIT_STOP
        return None

    def _decide(self, step: int, metrics: dict[str, float]) -> bool:
        actions = self.session.observe(step, metrics)
        self.decisions += actions
        return any(a.kind in STOP_KINDS for a in actions)

    def _calm(self) -> int:
        advice = sum(a.kind != "warn" for a in self.decisions)
        self.say(f"klguard watch: {self.last_step or 0} steps read; the guard stayed calm ({advice} advisory "
                 f"actions, {len(self.decisions) - advice} warnings); exit {EXIT_CALM}")
        return EXIT_CALM


class _WatchHost(AdvisoryHost):
    """Acts on nothing; writes each decision, marked advisory, to `events`."""

    events: Path

    def write_event(self, record: dict[str, Any]) -> None:
        append_event(self.events, {**record, "advisory": True}, who="klguard watch")


def _empty(path: Path) -> bool:
    if path.is_dir():
        try:
            detect_format(path)
        except UserError:
            return True
        return False
    return path.stat().st_size == 0
