"""GuardSession: hosting the guard, the same in every trainer. Pure Python, no process group needed.

A trainer (klguard's own, TRL's GRPOTrainer, verl's, or `klguard watch` reading a log) feeds the session each
step's metrics; the session asks its KLGuard for the step's actions, writes each to `events.jsonl` and has the
host (klguard.guard.host.GuardHost) carry it out, in the guard's order. It also keeps what hosting the guard
remembers between steps, and checkpoints it in one `state_dict()`:

- the stable checkpoints: a checkpoint the host writes after step N is pending until step N+1's metrics, measured
  on its weights, find them calm (no alarm, no rollback at that step); then it is stable. A rollback restores the
  newest stable checkpoint that still exists, else the reference's weights, else it pauses;
- the KL controller, for a host that has none of its own (TRL);
- the pause reason, with a hint in the host's own spelling of the settings to change.

The guard's state holds the warm-up's freeze of the KL coefficient, the lr scale, the gradient clip it set (or
last saw in the metrics) and the step whose policy the reference is; hosts read them from the session's KLGuard
(`session.guard.lr_scale`, ...), none keeps its own copy.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from klguard.guard import registry
from klguard.guard.actions import Action
from klguard.guard.guard import KLGuard
from klguard.guard.host import GuardHost, HostKeys, KLCoefController
from klguard.guard.tighten import KL_COEF_CAP

HINTS: dict[str, str] = {
    registry.HACKING: "raise {kl_coef} or set {guard}hacking_action=raise_kl_coef",
    KL_COEF_CAP: "lower {lr} (a beta at the cap only holds the policy at its reference), or raise {guard}kl_coef_max",
}
"""What a user can change after the guard's own pauses (each rule's is its declaration's `hint`), in the host's keys
(HostKeys: `{guard}` is the prefix of the guard's own)."""

DEFAULT_HINT = "adjust the {guard}* threshold named above"


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
        self._handlers: dict[str, Callable[[Action], None]] = {
            "warn": lambda action: None, "cut_lr": self._cut_lr, "raise_kl_coef": self._set_kl_coef,
            "freeze_kl_coef": self._set_kl_coef, "release_kl_coef": self._set_kl_coef,
            "lower_target_kl": self._lower_target_kl, "set_grad_clip": self._set_grad_clip,
            "rollback": self._rollback, "reanchor_reference": self._reanchor_reference, "pause": self._pause,
        }

    # ------------------------------------------------------------------ the step
    def guard_metrics(self) -> dict[str, float]:
        return self.guard.guard_metrics()

    def observe(self, step: int, metrics: Mapping[str, float], *, measured: bool = True) -> list[Action]:
        """Step `step`'s metrics: the guard's actions, applied in order and returned; then the pending checkpoint
        becomes stable if this step found its weights calm (`measured`: this step did measure them, e.g. it was
        not skipped for a non-finite value)."""
        actions = self.guard.observe(step, metrics)
        for action in actions:
            self.apply(action)
        calm = measured and self.guard.is_stable() and self.last_rollback_step != step
        if self.pending is not None and calm:
            self.stable.append(self.pending)
        self.pending = None
        return actions

    def update_kl(self, kl: float, n_steps: int) -> None:
        """The session's own controller takes the step's KL (not while the warm-up holds the coefficient)."""
        if self.controller is not None and not self.guard.kl_frozen:
            self.controller.update(kl, n_steps=n_steps)

    def apply(self, action: Action) -> None:
        """Write `action` to events.jsonl and have the host carry it out."""
        if action.kind != "pause":  # a pause's event carries its hint
            self.host.write_event(action.to_dict())
        self._handlers[action.kind](action)

    def pause(self, reason: str) -> None:
        """Stop the run after this step (the guard's pause, or the host's own reason)."""
        self.pause_reason = reason
        self.host.pause(reason)

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
        follow-ups for the restored step (re-anchoring, the warm-up)."""
        self.last_rollback_step = action.step
        restored = None
        for step in reversed(self.stable):
            restored = self.host.restore_checkpoint(step)
            if restored is not None:
                break
        if restored is None:
            restored = self.host.restore_reference(self.guard.reference_step)
        if restored is None:
            save = f" (set {self.keys.save_freq})" if self.keys is not None else ""
            self.pause(f"{action.reason} No stable checkpoint is on disk and the reference cannot be restored: "
                       f"paused instead{save}.")
            return
        for follow_up in self.guard.on_rollback(restored):
            self.apply(follow_up)

    def _pause(self, action: Action) -> None:
        hint = self.hint(action.rule)
        self.host.write_event(action.to_dict() | ({"to_go_on": hint} if hint else {}))
        self.pause(action.reason if hint is None else f"{action.reason} To go on: {hint}, then {self.keys.resume}.")

    # ------------------------------------------------------------------ checkpoints
    def state_dict(self) -> dict[str, Any]:
        """What a checkpoint holds of the guard's side (JSON-serialisable): the guard, the stable checkpoints, the
        pending one and, when the session owns it, the KL controller."""
        out: dict[str, Any] = {"guard": self.guard.state_dict(), "stable": list(self.stable), "pending": self.pending}
        if self.controller is not None:
            out["kl_ctrl"] = self.controller.state_dict()
        return out

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Resume from `state_dict()` (other keys, a host's own, are left to the host); raises KeyError, ValueError
        or TypeError on a state of another kind."""
        self.guard.load_state_dict(state["guard"])
        self.stable = [int(step) for step in state["stable"]]
        self.pending = None if state["pending"] is None else int(state["pending"])
        if self.controller is not None:
            self.controller.load_state_dict(state["kl_ctrl"])
