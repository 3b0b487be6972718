"""`klguard watch PATH [--follow]`: the guard in advisory mode over any trainer's log as it is written.

It reads the log in whatever format it is (klguard.integrations.logs tells it from the content: console output of
verl and TRL, any JSON lines, trainer_state.json, `step: N name: value` lines, pipe and whitespace tables,
TensorBoard, MLflow, W&B, CSV), maps its metric names to the guard's (per trainer, then by what the names mean, with
`--map name=guard_name[:transform]` first), says which guard inputs it found, which names it read by meaning and
which rules run with which values, feeds each step to the guard, prints one line per decision and writes them to an
events file. It acts on nothing: the exit code says what the guard decided, so that
`klguard watch --follow LOG || { [ $? -eq 3 ] && scancel $JOB; }` stops a run the guard would have rolled back or
paused (and nothing else: a typo or a missing log is exit 2, and `--follow` waits for a log that does not exist yet).
The exit codes (EXIT_CODES; stable):
0 the guard stayed calm (advice such as a higher KL coefficient may have been printed; the summary names the
failures that no rule could see for want of an input), 2 bad input, 3 it decided to roll back or pause (watching
stops there: the run's later steps are ones the guard would not have let happen), 4 blind: no rule could fire on
this log (no guard input found, or no step read), with a one-line hint naming what it saw and the `--map` to try.
On any log but klguard's own the guard runs with the defaults of a host that runs another trainer's model
(klguard.guard.config.EXTERNAL_HOST_DEFAULTS), as the TRL callback and the verl plugin do.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from klguard.commands.watch_rules import blind_to, inputs_line, off_line, rules_lines
from klguard.config.restricted import load_restricted, with_host_defaults
from klguard.errors import UserError
from klguard.guard import Action, AdvisoryHost, GuardSession, KLSetup, registry
from klguard.guard.config import EXTERNAL_HOST_DEFAULTS
from klguard.guard.registry import HACKING
from klguard.integrations.logs import MappedLog, detect_format, open_log
from klguard.integrations.logs.detect import NoMetricsYet
from klguard.integrations.logs.meaning import example_name
from klguard.integrations.metric_maps import split_target
from klguard.runtime.events import append_event

EXIT_CALM, EXIT_BAD_INPUT, EXIT_STOP, EXIT_BLIND = 0, UserError.exit_code, 3, 4
EXIT_CODES = {EXIT_CALM: "calm", EXIT_BAD_INPUT: "bad input", EXIT_STOP: "roll back or pause",
              EXIT_BLIND: "blind: no rule could fire"}
"""watch's exit codes, stable: scripts test them."""
SHOWN = 12  # names listed in one line at most
STOP_KINDS = ("rollback", "pause")
KEY_PREFIXES = ("guard.", "algorithm.kl_ctrl.", "trainer.total_training_steps")
"""The keys `watch` takes: the guard's, the KL controller's (its target and whether one steers the KL) and the
run length (the guard's warm-up is a share of it)."""
WHOSE = {None: "klguard's metric names", "verl": "verl's metric names", "trl": "TRL's metric names",
         "openrlhf": "OpenRLHF's metric names", "plain": "plain metric names, read as TRL's and their synonyms"}
HACKING_DO = ("read the samples of the steps the signals name before trusting the reward; raise the KL coefficient or "
              "roll back to the last checkpoint before them")
TRAINER_EVENTS = ("klguard", "trl")  # formats whose trainer may write its own events.jsonl beside the log


@dataclass
class WatchOptions:
    follow: bool = False
    fmt: str | None = None
    events: Path | None = None
    interval: float = 1.0  # seconds between polls with --follow
    idle_exit: float | None = None  # with --follow: stop (calm) once the log has not grown for this long
    names: list[str] = field(default_factory=list)  # --map name=guard_name


def events_path(reader: MappedLog) -> Path:
    """events.jsonl beside the log; watch_events.jsonl where the trainer itself may write events.jsonl."""
    folder = reader.path if reader.path.is_dir() else reader.path.parent
    return folder / ("watch_events.jsonl" if reader.format in TRAINER_EVENTS else "events.jsonl")


def parse_map(items: Sequence[str]) -> dict[str, str]:
    """`--map name=guard_name[:transform]` items as a dict; UserError naming a malformed one."""
    out = {}
    for item in items:
        name, sep, guard_name = item.partition("=")
        if not sep or not name.strip() or not guard_name.strip():
            raise UserError(f"--map {item!r}: expected NAME=GUARD_NAME, e.g. --map train_reward=critic/score/mean")
        try:
            split_target(guard_name.strip())
        except UserError as exc:
            raise UserError(f"--map {item!r}: {exc}, e.g. --map my_ppl=hacking/ref_nll:log") from None
        out[name.strip()] = guard_name.strip()
    return out


def load_settings(overrides: Sequence[str], external: bool):
    """watch's settings: the user's keys over the external hosts' defaults (`external`) or klguard's own."""
    overrides = with_host_defaults(overrides, EXTERNAL_HOST_DEFAULTS) if external else list(overrides)
    return load_restricted(overrides, KEY_PREFIXES, who="klguard watch",
                           elsewhere="the watched trainer's own settings stay in its launch line")


class Watch:
    """One log, one advisory guard. `run()` returns the exit code."""

    def __init__(self, path: str | Path, overrides: Sequence[str], options: WatchOptions,
                 say: Callable[[str], None] = print) -> None:
        self.overrides = overrides
        load_settings(overrides, external=False)  # a bad key is refused before the log is read
        self.user_map = parse_map(options.names)
        self.path, self.options, self.say = Path(path).expanduser(), options, say
        self.reader: MappedLog | None = None
        self.session: GuardSession | None = None
        self.host = WatchHost()
        self.last_step: int | None = None
        self.steps = 0  # steps judged (watching stops at a rollback or pause)
        self.read = 0  # steps read from the log
        self.span: tuple[int, int] | None = None  # the first and last step read
        self.names: set[str] = set()  # the guard's names of every metric read
        self.decisions: list[Action] = []

    def run(self) -> int:
        if not self.path.exists() and not self.options.follow:
            raise UserError(f"{self.path} does not exist")
        self.reader = self._open()
        config = load_settings(self.overrides, external=self.reader.format != "klguard")
        kc = config.algorithm.kl_ctrl  # the coefficient is the log's (none: the guard raises none)
        self.session = GuardSession.build(config.guard, self.host, total_steps=config.trainer.total_training_steps or 0,
                                          kl=KLSetup(target_kl=kc.target_kl, controlled=kc.type != "fixed"))
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

    def _open(self) -> MappedLog:
        """The reader; with --follow a log that does not exist yet, an empty one, or one with no metrics line yet,
        is waited for (up to --idle-exit seconds where given)."""
        started = time.monotonic()
        if not self.path.exists():
            self.say(f"klguard watch: waiting for {self.path} to appear")
        while True:
            idle = self.options.idle_exit
            if idle is not None and time.monotonic() - started > idle:
                raise UserError(f"{self.path}: no metrics appeared within --idle-exit {idle:g} s")
            if not self.path.exists():
                time.sleep(self.options.interval)
                continue
            try:
                return open_log(self.path, self.options.fmt, self.user_map)
            except NoMetricsYet:
                if not self.options.follow:
                    raise
            except UserError:
                if not self.options.follow or self.options.fmt or not _empty(self.path):
                    raise
            time.sleep(self.options.interval)

    def _describe(self, steps: list[tuple[int, dict[str, float]]]) -> None:
        """The first steps' guard inputs, the names read by meaning, and the rules that run on them or cannot
        fire."""
        names = set().union(*(metrics for _, metrics in steps))
        reader = self.reader
        whose = WHOSE.get(reader.trainer, f"{reader.trainer}'s metric names")
        mapped = f", --map {', '.join(f'{k}={v}' for k, v in self.user_map.items())}" if self.user_map else ""
        news = reader.take_news()
        meant = f"; {len(news)} by meaning" if news else ""
        self.say(f"klguard watch: {inputs_line(names)} ({whose}{mapped}{meant})")
        for line in self._meaning_lines(news):
            self.say(line)
        run, cannot = rules_lines(self.session.guard, names)
        self.say("klguard watch: rules: " + ("; ".join(run) or "none"))
        if cannot:
            self.say("klguard watch: cannot fire for want of their input: " + ", ".join(cannot))
        off = off_line(self.session.guard)
        if off:
            self.say(f"klguard watch: {off}")
        if reader.counted:
            self.say("klguard watch: these console dicts carry no step: steps are the entries' numbers")

    def _meaning_lines(self, news: list[tuple[str, str]]) -> list[str]:
        """What was read by meaning, the per-function rewards, what no map reads, and each ambiguity."""
        found = self.reader.inference
        if not self.reader.by_meaning or not (news or found.per_function or found.unmapped):
            return []
        parts = [f"read by meaning: {', '.join(f'{k} -> {v}' for k, v in news) or 'nothing'}"]
        if found.per_function:
            parts.append(f"per-function rewards (as critic/score/<fn>/mean): {_some(found.per_function)}")
        parts.append(f"left unmapped: {_some(found.unmapped) or 'nothing'}")
        lines = ["klguard watch: " + "; ".join(parts)]
        return lines + [f"klguard watch: ambiguous: {line}" for line in found.ambiguous]

    def _take(self, steps: list[tuple[int, dict[str, float]]]) -> int | None:
        if steps and self.read == 0:
            self._describe(steps)
        elif steps:
            news = self.reader.take_news()
            if news:
                self.say(f"klguard watch [step {steps[0][0]}]: read by meaning: "
                         + ", ".join(f"{k} -> {v}" for k, v in news))
        if steps:
            self.names.update(*(metrics for _, metrics in steps))
            self.read += len(steps)
            self.span = (steps[0][0] if self.span is None else self.span[0], steps[-1][0])
        for step, metrics in steps:
            if self.last_step is not None and step <= self.last_step:
                continue  # a relaunched trainer logs its resumed steps again
            if self.last_step is None and step > 0:
                self._decide(0, {})  # no step-0 validation in this log: the guard starts without a baseline
            self.last_step = step
            self.steps += 1
            if self._decide(step, metrics):
                self.say(f"klguard watch: the guard would stop the run at step {step}; exit {EXIT_STOP}")
                return EXIT_STOP
        return None

    def _decide(self, step: int, metrics: dict[str, float]) -> bool:
        actions = self.session.observe(step, metrics)
        self.decisions += actions
        return any(a.kind in STOP_KINDS for a in actions)

    def interrupted(self) -> int:
        """Ctrl-C: the verdict on the steps judged so far, as at the log's end (never calm on nothing)."""
        if self.session is None:
            self.say(f"klguard watch: stopped before the log could be read; exit {EXIT_BLIND}")
            return EXIT_BLIND
        return self._calm()

    def _calm(self) -> int:
        """Calm (exit 0, naming what no rule could see) or, where no rule could fire at all, blind (exit 4)."""
        cfg = self.session.guard.cfg
        run, _ = rules_lines(self.session.guard, self.names)
        if not run or self.steps == 0:
            return self._blind()
        advice = sum(a.kind != "warn" for a in self.decisions)
        window = cfg.baseline_window
        short = (f"; {self.steps} steps are too few for the rules that compare with the first {window}"
                 if self.steps <= window else "")
        unseen = blind_to(self.session.guard, self.names)
        if unseen:
            self.say("klguard watch: no rule could see: " + "; ".join(unseen))
        self.say(f"klguard watch: {self.steps} steps read; the guard stayed calm ({advice} advisory "
                 f"actions, {len(self.decisions) - advice} warnings){short}; exit {EXIT_CALM}")
        return EXIT_CALM

    def _blind(self) -> int:
        reader = self.reader
        seen = sorted(reader.raw_names)
        example = example_name(reader.inference.per_function + reader.inference.unmapped)
        what = (f"its {len(seen)} metric names give no rule an input (saw: {_some(seen)})" if seen
                else "no step with a metric was read")
        self.say(f"klguard watch: blind: no rule could fire on {self.steps} steps: {what}; name an input with --map, "
                 f"e.g. --map {example}=critic/score/mean (guard names: docs/watch.md); exit {EXIT_BLIND}")
        return EXIT_BLIND


class WatchHost(AdvisoryHost):
    """Acts on nothing; writes each decision, marked advisory, to `events`, with the rule's one line of what to do
    (its declaration's `do`, as `do` in the event and `Do this: ...` after the reason)."""

    events: Path

    def write_event(self, record: dict[str, Any]) -> None:
        do = do_this(record.get("rule", ""))
        if do:
            record = {**record, "do": do, "reason": f"{record['reason']} Do this: {do}."}
        append_event(self.events, {**record, "advisory": True}, who="klguard watch")


def do_this(rule: str) -> str:
    """What to do when `rule` decides (its declaration's `do`; the hacking alarm's own), "" where none is said."""
    if rule == HACKING:
        return HACKING_DO
    declared = registry.rule(rule)
    return declared.do if declared is not None else ""


def _empty(path: Path) -> bool:
    if path.is_dir():
        try:
            detect_format(path)
        except UserError:
            return True
        return False
    return path.stat().st_size == 0


def _some(names: list[str]) -> str:
    """Up to SHOWN names, then how many more."""
    more = f", ... ({len(names) - SHOWN} more)" if len(names) > SHOWN else ""
    return ", ".join(names[:SHOWN]) + more
