"""What a trainer does for its guard session (klguard.guard.session): the host protocol, and how it spells the
settings a pause's hint names.

The session decides what to do with each action (in which order, with which values, what to fall back to); a host
only carries it out on its trainer. A host that cannot do something live (verl: the lr, the gradient clip or the
KL-loss coefficient need a relaunch) does it its own way in its adapter, e.g. by saving it for the next launch.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Protocol


class GuardHost(Protocol):
    def set_kl_coef(self, value: float | None, *, frozen: bool) -> None:
        """Use KL coefficient `value` from the next step on (None: keep the controller's own); `frozen`: the
        controller holds it (no updates) until a later call says otherwise."""

    def set_target_kl(self, value: float) -> None:
        """The KL controller's target from now on."""

    def set_lr_scale(self, scale: float, ratio: float) -> None:
        """The actor's lr is now `scale` times its configured (scheduled) lr: `ratio` times what it was."""

    def set_grad_clip(self, clip: float) -> None:
        """Clip the actor's gradient norm to `clip` from the next step on."""

    def restore_checkpoint(self, step: int) -> int | None:
        """Load checkpoint `step`'s weights and optimizer states (the step counter, the data position and the lr
        scale go on); returns the step restored, or None when that checkpoint is gone or damaged."""

    def restore_reference(self, reference_step: int) -> int | None:
        """No stable checkpoint: load the reference's weights (of step `reference_step`; a host that keeps none
        loads the initial policy) with a fresh optimizer; returns the step of the weights restored, or None when it
        cannot."""

    def reanchor_reference(self, step: int) -> None:
        """Make the reference a frozen copy of the policy just restored (of step `step`)."""

    def pause(self, reason: str) -> None:
        """Stop after this step with a checkpoint; `reason` says why and what to change before going on."""

    def write_event(self, record: dict[str, Any]) -> None:
        """Append one decision to the run's `events.jsonl` (the process that writes, only)."""

    def say(self, message: str) -> None:
        """Print one line to the user (the process that prints, only)."""


class KLCoefController(Protocol):
    """A KL controller the session owns for a host that has none (klguard.algo.kl's controllers)."""

    value: float

    def update(self, current_kl: float, n_steps: int) -> None: ...

    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state: Mapping[str, Any]) -> None: ...


@dataclass(frozen=True)
class HostKeys:
    """How a host's user sets what a pause's hint asks to change, and how the run goes on after a pause."""

    kl_coef: str  # the KL coefficient: "algorithm.kl_ctrl.kl_coef", "GRPOConfig beta"
    lr: str  # the actor's learning rate
    save_freq: str  # how often checkpoints (rollback targets) are written
    resume: str  # what the user runs after the change: "rerun (trainer.resume_mode=auto resumes)"
    target_kl: str = "algorithm.kl_ctrl.target_kl"
    guard: str = "guard."  # the prefix of the guard's own keys (verl's launch line: "+klguard.guard.")


class AdvisoryHost:
    """A host that acts on nothing (`klguard watch`): every action is only written down; rollbacks find nothing
    to restore."""

    def set_kl_coef(self, value: float | None, *, frozen: bool) -> None:
        pass

    def set_target_kl(self, value: float) -> None:
        pass

    def set_lr_scale(self, scale: float, ratio: float) -> None:
        pass

    def set_grad_clip(self, clip: float) -> None:
        pass

    def restore_checkpoint(self, step: int) -> int | None:
        return None

    def restore_reference(self, reference_step: int) -> int | None:
        return None

    def reanchor_reference(self, step: int) -> None:
        pass

    def pause(self, reason: str) -> None:
        pass

    def write_event(self, record: dict[str, Any]) -> None:
        pass

    def say(self, message: str) -> None:
        pass
