"""klguard's trainer as the host of its guard session (klguard.guard.session): what each of the guard's actions
does to a run's TrainState, its checkpoints and `events.jsonl`, and how its keys are spelt.

The session decides what to do and when (and keeps the stable checkpoints, the lr scale, the gradient clip, the
warm-up's freeze and the reference's step); this module does it here: it sets the KL controller's coefficient and
target, applies the lr scale, restores a checkpoint's weights or the initial policy, re-anchors the reference.
Under torchrun every rank applies the same actions (they follow from the same gathered metrics); only rank 0
writes and prints them.
"""

from __future__ import annotations

from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any

from klguard.config.roles import kl_setup
from klguard.distributed.sharded_checkpoint import copy_weights
from klguard.guard import GuardSession, HostKeys
from klguard.model.lora import merged_state_dict, saved_lora
from klguard.runtime.events import append_event

if TYPE_CHECKING:
    from collections.abc import Callable

    import torch

    from klguard.config.schema import Config
    from klguard.ppo.checkpointing import Checkpoints
    from klguard.ppo.state import TrainState

TRAINER_KEYS = HostKeys(kl_coef="algorithm.kl_ctrl.kl_coef", lr="actor_rollout_ref.actor.optim.lr",
                        save_freq="trainer.save_freq", resume="rerun (trainer.resume_mode=auto resumes)")


class PPOHost:
    """The guard of one run: the trainer feeds it each step's metrics and it carries out the actions on `state`
    (rollbacks through `checkpoints`). `writes`: this process writes `events.jsonl` (rank 0)."""

    def __init__(self, cfg: Config, state: TrainState, checkpoints: Checkpoints, *, total_steps: int,
                 run_dir: Path, writes: bool, new_reference: Callable[[], torch.nn.Module] | None = None,
                 log=print) -> None:
        self.state, self.checkpoints, self.log = state, checkpoints, log
        self.new_reference = new_reference  # a reference of its own, for a re-anchor where the LoRA base was it
        self.session = GuardSession.build(cfg.guard, self, total_steps=total_steps, kl=kl_setup(cfg),
                                          keys=TRAINER_KEYS)
        self.configured_grad_clip = cfg.actor_rollout_ref.actor.grad_clip
        self.events_path = Path(run_dir) / "events.jsonl"
        self.writes = writes
        self.restored = False  # this step's actions restored weights (a checkpoint's or the initial policy)

    # ------------------------------------------------------------------ what the loop reads
    @property
    def kl_guard(self):
        """The session's guard (for tests and tools: the loop asks this adapter)."""
        return self.session.guard

    @property
    def pause_reason(self) -> str | None:
        return self.session.pause_reason

    @property
    def lr_scale(self) -> float:
        """The share of the scheduled lr the actor uses (the guard's cuts)."""
        return self.session.guard.lr_scale

    @property
    def actor_grad_clip(self) -> float:
        """The clip the guard set (or saw this run use), else the configured one."""
        clip = self.session.guard.grad_clip
        return self.configured_grad_clip if clip is None else clip

    def same_on_every_rank(self) -> dict[str, float]:
        """What every rank's guard must agree on (trainer.debug)."""
        guard = self.session.guard
        return {"kl_frozen": float(guard.kl_frozen), "lr_scale": guard.lr_scale,
                "paused": float(self.pause_reason is not None), "reference_step": float(guard.reference_step)}

    def observe(self, step: int, metrics: dict[str, float], *, measured: bool = True) -> dict[str, float]:
        """Feed one step's metrics to the guard, apply its actions, return the `guard/*` metrics. `measured`: the
        step measured the weights it started from (it was not skipped)."""
        self.restored = False
        self.session.observe(step, metrics, measured=measured)
        return self.session.guard_metrics()

    def update_kl(self, kl: float, n_steps: int) -> None:
        """The run's KL controller takes the step's KL (not while the warm-up holds the coefficient)."""
        self.session.update_kl(kl, n_steps, self.state.kl_ctrl)

    def stop(self, reason: str, step: int) -> None:
        """Pause the run after `step` for a reason of the trainer's own."""
        self.session.pause(reason, step)

    def save_checkpoint(self, tokenizer) -> None:
        """A checkpoint of this step, with the guard's side; the next step judges whether it is stable."""
        session, step = self.session, self.state.step
        saved = self.checkpoints.save(self.state, guard_state=session.checkpoint(step), tokenizer=tokenizer,
                                      keep=session.stable[-1:], save_reference=session.guard.reference_step != 0)
        if saved is None:  # not written (a weight was not finite): nothing to judge
            session.drop_checkpoint(step)

    def load_state_dict(self, state: dict) -> None:
        """Resume the guard's side, then the lr scale it holds. A checkpoint that saved the guard's own state alone
        lists no stable checkpoints: a rollback before the next confirmed one restores the initial policy."""
        self.session.load_state_dict(state if "guard" in state else {"guard": state, "stable": [], "pending": None})
        self.state.apply_lr_scale(self.lr_scale)

    def record_nonfinite(self, step: int, where: str) -> None:
        """Log a step skipped for a NaN/Inf in `where` (e.g. `rewards`, `actor/pg_loss`), guard or not."""
        self.write_event({"step": step, "kind": "nonfinite_skip", "rule": "nonfinite", "where": where,
                          "reason": f"non-finite values in {where}: step {step} not applied"})

    # ------------------------------------------------------------------ the host (klguard.guard.GuardHost)
    def set_kl_coef(self, value: float | None, *, frozen: bool) -> None:
        if value is not None:  # update_kl skips the controller while the warm-up holds it
            self.state.kl_ctrl.value = value

    def set_target_kl(self, value: float) -> None:
        self.state.kl_ctrl.target_kl = value

    def set_lr_scale(self, scale: float, ratio: float) -> None:
        self.state.apply_lr_scale(scale)

    def set_grad_clip(self, clip: float) -> None:
        pass  # the loop reads actor_grad_clip, the session's clip from now on

    def restore_checkpoint(self, step: int) -> int | None:
        restored = self.checkpoints.rollback_to(step, self.state)
        if restored is not None:
            self.state.apply_lr_scale(self.lr_scale)
            self.restored = True
        return restored

    def restore_reference(self, reference_step: int) -> int | None:
        """The initial policy, loaded again from its folder (whatever the reference holds now)."""
        self.restored = True
        return self.checkpoints.rollback_to_initial(self.state)

    def reanchor_reference(self, step: int) -> None:
        if not self.state.has_reference:
            return
        if self.state.ref is None:  # the LoRA actor's base was the reference: it gets a model of its own now
            if self.new_reference is None:
                raise RuntimeError("re-anchoring the LoRA base's reference needs new_reference")
            self.state.ref, self.state.ref_in_actor = self.new_reference(), False
        adapters = saved_lora(self.state.actor.config)
        copy_weights(self.state.actor, self.state.ref,
                     convert=None if adapters is None else partial(merged_state_dict, settings=adapters))
        self.log(f"klguard: the reference is now the policy of step {step}")

    def pause(self, reason: str) -> None:
        pass  # fit stops on pause_reason, with a checkpoint

    def write_event(self, record: dict[str, Any]) -> None:
        if self.writes:
            append_event(self.events_path, record)

    def say(self, message: str) -> None:
        self.log(message)
