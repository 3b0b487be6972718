"""GuardSession: hosting the guard, the same in every trainer. Pure Python, no process group needed.

A trainer (klguard's own, TRL's GRPOTrainer, verl's, or `klguard watch` reading a log) feeds the session each
step's metrics; the session asks its KLGuard for the step's actions, writes each to `events.jsonl` and has the
host (klguard.guard.host.GuardHost, which says what a host provides) carry it out, in the guard's order. It owns
what every host would otherwise write again:

- building the guard from the run's `guard.*` config and the host's KL facts (`GuardSession.build`, `KLSetup`);
- the stable checkpoints: a checkpoint of step N is pending until the first step after N's own metrics, measured on
  its weights, finds them calm (no alarm, no rollback at that step); then it is stable. A host calls `checkpoint(N)`
  when it writes one, whenever that is (klguard's trainer and TRL after step N's metrics, verl during the step,
  before them). A rollback restores the newest stable checkpoint that still exists, else the reference's weights,
  else it pauses;
- the state a checkpoint holds (`checkpoint`, `state_dict`), versioned (klguard.guard.state.STATE_VERSION) and
  read back by `resume`, with the host's own keys beside it; `save_state` and `read_state` write and read it as a
  file of its own, atomically;
- the warm-up's hold of the KL coefficient: no controller update while it holds (`update_kl`), and the coefficient
  to set again before each step where the host's controller cannot hold (`held_kl_coef`);
- the KL controller, for a host that has none of its own (TRL);
- the pause reason, with a hint in the host's own spelling of the settings to change;
- saying, once the first steps are in, which rules the host's metrics give no input (`_check_inputs`).

The guard's state holds the lr scale, the gradient clip it set (or last saw in the metrics) and the step whose
policy the reference is; hosts read them from the session's KLGuard (`session.guard.lr_scale`, ...), none keeps its
own copy.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from klguard.files import atomic_write_text
from klguard.guard import registry
from klguard.guard.actions import Action
from klguard.guard.config import GuardConfig
from klguard.guard.guard import KLGuard
from klguard.guard.host import GuardHost, HostKeys, KLCoefController, KLSetup
from klguard.guard.inputs import missing_input
from klguard.guard.state import READABLE_VERSIONS, STATE_VERSION
from klguard.guard.tighten import KL_COEF_CAP

HINTS: dict[str, str] = {
    registry.HACKING: "raise {kl_coef} or set {guard}hacking_action=raise_kl_coef",
    KL_COEF_CAP: "lower {lr} (a beta at the cap only holds the policy at its reference), or raise {guard}kl_coef_max",
}
"""What a user can change after the guard's own pauses (each rule's is its declaration's `hint`), in the host's keys
(HostKeys: `{guard}` is the prefix of the guard's own)."""

DEFAULT_HINT = "adjust the {guard}* threshold named above"
SESSION_KEYS = ("version", "guard", "stable", "pending")
"""The keys of a session's state (and `kl_ctrl` where it owns the KL controller); the others belong to its host."""
MEASURED_FLAGS = ("guard/alarm_", "guard/hack_", "guard/hacking_alarm")  # what a step's rules found


class GuardSession:
    """The guard of one run, acting through `host`. `keys`: the host's spelling of the settings a pause's hint
    names (None: pauses carry no hint). `controller`: the KL controller when the host has none of its own; the
    session then updates it (update_kl), sets the guard's coefficient and target on it and checkpoints it."""

    def __init__(self, guard: KLGuard, host: GuardHost, keys: HostKeys | None = None,
                 controller: KLCoefController | None = None) -> None:
        self.guard, self.host, self.keys, self.controller = guard, host, keys, controller
        self.stable: list[int] = []  # checkpoint steps whose weights the step after them found calm, oldest first
        # the checkpoint just written, judged by the next step; the host sets it as it writes one, before it takes
        # state_dict(), so that a run resumed from that checkpoint judges it too
        self.pending: int | None = None
        self.pause_reason: str | None = None
        self.last_rollback_step: int | None = None
        self.observed: int | None = None  # the last step whose metrics the session took
        self.saving: int | None = None  # a checkpoint written during a step whose metrics have not come yet
        self.inputs_seen: set[str] | None = set()  # the metric names of the first steps (None: checked)
        self.input_steps = 0
        self._measured: dict[str, float] = {}  # the last step's flags as its rules measured them (see guard_metrics)
        self._handlers: dict[str, Callable[[Action], None]] = {
            "warn": lambda action: None, "cut_lr": self._cut_lr, "raise_kl_coef": self._set_kl_coef,
            "freeze_kl_coef": self._set_kl_coef, "release_kl_coef": self._set_kl_coef,
            "lower_target_kl": self._lower_target_kl, "set_grad_clip": self._set_grad_clip,
            "rollback": self._rollback, "reanchor_reference": self._reanchor_reference, "pause": self._pause,
        }

    @classmethod
    def build(cls, cfg: GuardConfig, host: GuardHost, *, total_steps: int, kl: KLSetup | None = None,
              keys: HostKeys | None = None, controller: KLCoefController | None = None) -> GuardSession:
        """The session of one run: its guard built from `cfg` (the run's `guard.*` keys, over the host's defaults)
        and `kl` (what the host knows of its KL control), acting through `host`."""
        kl = kl or KLSetup()
        guard = KLGuard(cfg, total_steps=total_steps, target_kl=kl.target_kl, kl_coef=kl.kl_coef,
                        kl_controlled=kl.controlled, kl_metric=kl.metric)
        return cls(guard, host, keys, controller)

    # ------------------------------------------------------------------ the step
    def guard_metrics(self) -> dict[str, float]:
        """The guard's metrics after the last step's actions, with its alarm and signal flags as the step measured
        them: a rollback clears the flags for the steps after it, and the step that rolled back still says which
        rules fired in it (a signal that fired beside the rule that rolled back included)."""
        return self.guard.guard_metrics() | self._measured

    def observe(self, step: int, metrics: Mapping[str, float], *, measured: bool = True) -> list[Action]:
        """Step `step`'s metrics: the guard's actions, applied in order and returned; then the pending checkpoint
        becomes stable if this step found its weights calm (`measured`: this step did measure them, e.g. it was
        not skipped for a non-finite value)."""
        self._check_inputs(metrics)
        actions = self.guard.observe(step, metrics)
        self._measured = {k: v for k, v in self.guard.guard_metrics().items() if k.startswith(MEASURED_FLAGS)}
        for action in actions:
            self.apply(action)
        calm = measured and self.guard.is_stable() and self.last_rollback_step != step
        if self.pending is not None and calm:
            self.stable.append(self.pending)
        self.pending = None
        if self.saving == step and self.last_rollback_step != step:  # saved during this step: the next judges it
            self.pending = step
        self.saving = None if self.saving is not None and self.saving <= step else self.saving
        self.observed = step
        return actions

    def _check_inputs(self, metrics: Mapping[str, float]) -> None:
        """After the first `guard.baseline_window` steps, say once which rules that can fire here got no input in
        any of them (a trainer that logs no KL; a signal whose metric it does not log): blind, not calm."""
        if self.inputs_seen is None:
            return
        self.inputs_seen.update(metrics)
        self.input_steps += 1
        if self.input_steps < self.guard.cfg.baseline_window:
            return
        seen, self.inputs_seen = self.inputs_seen, None
        lacking = [f"{r.name} ({' or '.join(missing)})" for r in registry.rules() if r.active(self.guard)
                   and (missing := missing_input(r, seen, self.guard.cfg.val_metric)) is not None]
        if lacking:
            self.host.say(f"klguard: no input in the first {self.input_steps} steps for {', '.join(lacking)}: "
                          "these cannot fire until a step logs it")

    def update_kl(self, kl: float, n_steps: int, controller: KLCoefController | None = None) -> None:
        """The KL controller (the host's `controller`, else the session's own) takes the step's KL, unless the
        warm-up holds the coefficient."""
        controller = controller or self.controller
        if controller is not None and not self.guard.kl_frozen:
            controller.update(kl, n_steps=n_steps)

    @property
    def held_kl_coef(self) -> float | None:
        """The coefficient the warm-up holds (None: it holds none): a host whose controller cannot hold it (verl's
        moves during the step) sets it again before each step."""
        return self.guard.kl_coef if self.guard.kl_frozen else None

    def apply(self, action: Action) -> None:
        """Write `action` to events.jsonl and have the host carry it out."""
        if action.kind not in ("pause", "rollback"):  # a pause's event carries its hint, a rollback's what it restored
            self.host.write_event(action.to_dict())
        self._handlers[action.kind](action)

    def pause(self, reason: str, step: int | None = None) -> None:
        """Stop the run after step `step` (the guard's pause, or the host's own reason), and say so."""
        self.pause_reason = reason
        self.host.pause(reason)
        self.host.say(f"klguard: paused at step {self.observed if step is None else step}: {reason}")

    def hint(self, rule: str) -> str | None:
        """What to change before going on after `rule` paused the run, in the host's keys."""
        if self.keys is None:
            return None
        declared = registry.rule(rule)
        hint = declared.hint if declared is not None and declared.hint else HINTS.get(rule, DEFAULT_HINT)
        return hint.format_map(vars(self.keys))

    # ------------------------------------------------------------------ the actions
    def _set_kl_coef(self, action: Action) -> None:
        value = action.new
        if self.controller is not None:
            if value is not None:
                self.controller.value = value
            value = self.controller.value
        self.host.set_kl_coef(value, frozen=self.guard.kl_frozen)

    def _lower_target_kl(self, action: Action) -> None:
        if self.controller is not None and hasattr(self.controller, "target_kl"):
            self.controller.target_kl = action.new
        self.host.set_target_kl(action.new)

    def _cut_lr(self, action: Action) -> None:
        self.host.set_lr_scale(action.new, action.new / action.old)

    def _set_grad_clip(self, action: Action) -> None:
        self.host.set_grad_clip(action.new)

    def _reanchor_reference(self, action: Action) -> None:
        self.host.reanchor_reference(int(action.new))

    def _rollback(self, action: Action) -> None:
        """The newest stable checkpoint that still exists, else the reference, else a pause; then the guard's
        follow-ups for the restored step (re-anchoring, the warm-up). The event names the step restored (None: the
        rollback became a pause)."""
        self.last_rollback_step = action.step
        restored = None
        for step in reversed(self.stable):
            restored = self.host.restore_checkpoint(step)
            if restored is not None:
                break
        if restored is None:
            restored = self.host.restore_reference(self.guard.reference_step)
        self.host.write_event(action.to_dict() | {"restored_step": restored})
        if restored is None:
            save = f" (set {self.keys.save_freq})" if self.keys is not None else ""
            self.pause(f"{action.reason} No stable checkpoint is on disk and the reference cannot be restored: "
                       f"paused instead{save}.", action.step)
            return
        for follow_up in self.guard.on_rollback(restored):
            self.apply(follow_up)

    def _pause(self, action: Action) -> None:
        hint = self.hint(action.rule)
        self.host.write_event(action.to_dict() | ({"to_go_on": hint} if hint else {}))
        self.pause(action.reason if hint is None else f"{action.reason} To go on: {hint}, then {self.keys.resume}.",
                   action.step)

    # ------------------------------------------------------------------ checkpoints
    def checkpoint(self, step: int, **host_state: Any) -> dict[str, Any]:
        """The host writes a checkpoint of step `step` (the weights that step left): it becomes pending, judged by
        the first step observed after `step`'s own metrics (at once when they were observed, else once they are).
        Returns the state to write beside it, with the host's own keys."""
        if self.observed is not None and step <= self.observed:
            self.pending = step
        else:
            self.saving = step
        return self.state_dict(**host_state)

    def drop_checkpoint(self, step: int) -> None:
        """The checkpoint of `step` was not written after all: nothing to judge."""
        if self.pending == step:
            self.pending = None
        if self.saving == step:
            self.saving = None

    def state_dict(self, **host_state: Any) -> dict[str, Any]:
        """What a checkpoint holds of the guard's side (JSON-serialisable): the version, the guard, the stable
        checkpoints, the pending one and, when the session owns it, the KL controller; then the host's own keys."""
        clash = sorted(set(host_state) & set(self._keys()))
        if clash:
            raise ValueError(f"host state keys {clash} are the session's")
        out: dict[str, Any] = {"version": STATE_VERSION, "guard": self.guard.state_dict(), "stable": list(self.stable),
                               "pending": self.pending}
        if self.controller is not None:
            out["kl_ctrl"] = self.controller.state_dict()
        return out | host_state

    def load_state_dict(self, state: Mapping[str, Any]) -> dict[str, Any]:
        """Resume from `state_dict()`; returns the host's own keys. Raises ValueError on a version this klguard cannot
        read, KeyError, ValueError or TypeError on a state of another kind."""
        version = state.get("version", STATE_VERSION)  # klguard's trainer wrote none before version 2
        if version not in READABLE_VERSIONS:
            raise ValueError(f"klguard state version {version!r} is not supported (this klguard reads "
                             f"{', '.join(map(str, READABLE_VERSIONS))}): resume with the klguard that wrote it")
        self.guard.load_state_dict(state["guard"])
        self.stable = [int(step) for step in state["stable"]]
        self.pending = None if state["pending"] is None else int(state["pending"])
        if self.controller is not None:
            self.controller.load_state_dict(state["kl_ctrl"])
        return {k: v for k, v in state.items() if k not in self._keys()}

    def _keys(self) -> tuple[str, ...]:
        return SESSION_KEYS + (("kl_ctrl",) if self.controller is not None else ())

    @staticmethod
    def save_state(path: Path, state: Mapping[str, Any]) -> None:
        """Write `state` (from `checkpoint` or `state_dict`) to `path` as JSON, whole or not at all."""
        atomic_write_text(Path(path), json.dumps(state, sort_keys=True))

    @staticmethod
    def read_state(path: Path) -> dict[str, Any] | None:
        """A state `save_state` wrote (None where there is no file); ValueError on a version this klguard cannot
        read."""
        path = Path(path)
        if not path.is_file():
            return None
        state = json.loads(path.read_text())
        if state.get("version") not in READABLE_VERSIONS:
            raise ValueError(f"{path}: klguard state version {state.get('version')!r} is not supported (this klguard "
                             f"reads {', '.join(map(str, READABLE_VERSIONS))}): resume with the klguard that wrote it")
        return state
