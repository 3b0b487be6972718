"""Applies the KL guard's actions to a run's TrainState, and writes them to `events.jsonl`.

The guard decides (klguard.guard, metrics in, actions out); this module acts: it changes the KL
coefficient and target, scales the actor's learning rate, tightens gradient clipping, rolls the
weights back to the last stable checkpoint and asks the loop to pause. Under torchrun every rank applies
the same actions (they follow from the same gathered metrics); only rank 0 writes and prints them.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from klguard.config.roles import initial_kl_coef, kl_controlled
from klguard.distributed.sharded_checkpoint import copy_weights
from klguard.guard import Action, KLGuard
from klguard.runtime.events import append_event

if TYPE_CHECKING:
    from klguard.config.schema import Config
    from klguard.ppo.checkpointing import Checkpoints
    from klguard.ppo.state import TrainState


# What a user can change after a pause, by the rule that paused the run.
PAUSE_HINTS = {
    "kl_hard": "raise algorithm.kl_ctrl.kl_coef or guard.kl_hard_limit",
    "val_drop": "raise algorithm.kl_ctrl.kl_coef, lower actor_rollout_ref.actor.optim.lr or raise guard.val_drop_max",
    "ppo_kl": "lower actor_rollout_ref.actor.optim.lr or raise guard.ppo_kl_max",
    "hacking": "raise algorithm.kl_ctrl.kl_coef or set guard.hacking_action=raise_kl_coef",
    "penalty_share": "lower actor_rollout_ref.actor.optim.lr, or raise guard.penalty_share_max if the reward's "
                     "scale is near 0 (a learned RM's often is)",
    "kl_slow": "lower actor_rollout_ref.actor.optim.lr or raise algorithm.kl_ctrl.target_kl",
    "kl_coef_cap": "lower actor_rollout_ref.actor.optim.lr (a beta at the cap only holds the policy at its "
                   "reference), or raise guard.kl_coef_max",
}


DEFAULT_HINT = "adjust the guard.* threshold named above"


class GuardHooks:
    """The guard of one run: feeds it each step's metrics and applies its actions to `state` (rollbacks through
    `checkpoints`). `writes`: this process writes `events.jsonl` and prints the actions (rank 0)."""

    def __init__(self, cfg: Config, state: TrainState, checkpoints: Checkpoints, *, total_steps: int,
                 run_dir: Path, writes: bool, log=print) -> None:
        self.state, self.checkpoints, self.log = state, checkpoints, log
        self.enabled = cfg.guard.enable
        self.guard = KLGuard(cfg.guard, total_steps=total_steps, target_kl=cfg.algorithm.kl_ctrl.target_kl,
                             kl_coef=initial_kl_coef(cfg), kl_controlled=kl_controlled(cfg))
        self.events_path = Path(run_dir) / "events.jsonl"
        self.writes = writes
        self.pause_reason: str | None = None
        self.last_rollback_step: int | None = None

    def observe(self, step: int, metrics: dict[str, float]) -> dict[str, float]:
        """Feed one step's metrics to the guard, apply its actions, return the `guard/*` metrics."""
        if not self.enabled:
            return {}
        for action in self.guard.observe(step, metrics):
            self._apply(action)
        return self.guard.guard_metrics()

    def _apply(self, action: Action) -> None:
        state = self.state
        hint = PAUSE_HINTS.get(action.rule, DEFAULT_HINT) if action.kind == "pause" else None
        self._record(action, hint)
        if action.kind == "cut_lr":
            state.lr_scale = action.new
            state.apply_lr_scale()
        elif action.kind in ("raise_kl_coef", "freeze_kl_coef"):
            state.kl_ctrl.value = action.new
            state.kl_frozen = action.kind == "freeze_kl_coef" or state.kl_frozen
        elif action.kind == "release_kl_coef":
            state.kl_frozen = False
            if action.new is not None:
                state.kl_ctrl.value = action.new
        elif action.kind == "lower_target_kl":
            state.kl_ctrl.target_kl = action.new
        elif action.kind == "set_grad_clip":
            state.actor_grad_clip = action.new
        elif action.kind == "rollback":
            self.last_rollback_step = action.step
            restored = self.checkpoints.rollback_to_stable(state)
            for follow_up in self.guard.on_rollback(restored):
                self._apply(follow_up)
        elif action.kind == "reanchor_reference":
            self._reanchor_reference(int(action.new))
        elif action.kind == "pause":
            self.pause_reason = f"{action.reason} To go on: {hint}, then rerun (trainer.resume_mode=auto resumes)."

    def _reanchor_reference(self, step: int) -> None:
        """Make the reference a frozen copy of the current (just restored) policy of step `step`."""
        if self.state.ref is None:
            return
        copy_weights(self.state.actor, self.state.ref)
        self.state.reference_step = step
        self.log(f"klguard: the reference is now the policy of step {step}")

    def _record(self, action: Action, hint: str | None = None) -> None:
        """One line of events.jsonl; a pause's carries `to_go_on`, what to change before rerunning."""
        if not self.writes:
            return
        append_event(self.events_path, action.to_dict() | ({"to_go_on": hint} if hint else {}))

    def confirms(self, step: int) -> bool:
        """Whether step `step` found the weights it started from calm (no alarm, no rollback)."""
        if not self.enabled:
            return True
        return self.guard.is_stable() and self.last_rollback_step != step

    def state_dict(self) -> dict:
        return self.guard.state_dict()

    def load_state_dict(self, state: dict) -> None:
        self.guard.load_state_dict(state)

    def record_nonfinite(self, step: int, where: str) -> None:
        """Log a step skipped for a NaN/Inf in `where` (e.g. `rewards`, `actor/pg_loss`), guard or not."""
        if not self.writes:
            return
        record = {"step": step, "kind": "nonfinite_skip", "rule": "nonfinite", "where": where,
                  "reason": f"non-finite values in {where}: step {step} not applied"}
        append_event(self.events_path, record)
