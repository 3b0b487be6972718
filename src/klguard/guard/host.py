"""What a trainer provides to host the guard, in one place: `GuardHost` (carry out each action), `HostKeys` (how its
user spells the settings a pause's hint names) and `KLSetup` (what it knows of its KL control). The session
(klguard.guard.session) does everything else: it builds the guard, decides what each action means (in which order,
with which values, what to fall back to), keeps the stable checkpoints, their timing and the versioned state, and
holds the warm-up's coefficient.

A host's adapter is one file that carries out actions on its trainer and spells its keys, with no guard logic of its
own. Its trainer, in turn, calls the session at five points:

1. at the start: ``session = GuardSession.build(cfg.guard, host, total_steps=..., kl=KLSetup(...), keys=KEYS)``
   (with a `KLCoefController` as ``controller=`` when the trainer has no KL controller of its own), then
   ``session.observe(0, {})`` for the warm-up's freeze of step 1;
2. after each step's metrics (verl's names: klguard.integrations.metric_maps maps other trainers'):
   ``session.observe(step, metrics)``, and log ``session.guard_metrics()``; its KL controller steps through
   ``session.update_kl(kl, n_steps, controller)``, which the warm-up holds;
3. when it writes a checkpoint of step N, whenever that is: ``state = session.checkpoint(N, **its_own_keys)``, saved
   with the checkpoint (`GuardSession.save_state` writes it as a file of its own, atomically);
4. on resume: ``its_own_keys = session.load_state_dict(state)`` (`GuardSession.read_state` reads the file);
5. when it stops for a reason of its own: ``session.pause(reason, step)``.

A host for a plain training loop, with its own KL controller and checkpoints as folders of weights::

    class LoopHost:  # klguard.guard.GuardHost
        def __init__(self, loop): self.loop = loop
        def set_kl_coef(self, value, *, frozen):
            if value is not None: self.loop.kl_ctrl.value = value  # the session's update_kl skips a frozen one
        def set_target_kl(self, value): self.loop.kl_ctrl.target_kl = value
        def set_lr_scale(self, scale, ratio): self.loop.lr_scale = scale
        def set_grad_clip(self, clip): self.loop.grad_clip = clip
        def restore_checkpoint(self, step): return self.loop.load(step)  # None when it is gone
        def restore_reference(self, reference_step): return None  # keeps no copy of the reference
        def reanchor_reference(self, step): self.loop.ref.load_state_dict(self.loop.policy.state_dict())
        def pause(self, reason): self.loop.stop = True
        def write_event(self, record): self.loop.events.write(json.dumps(record) + "\\n")
        def say(self, message): print(message)

    KEYS = HostKeys(kl_coef="--kl-coef", lr="--lr", save_freq="--save-every", resume="rerun with --resume")
    session = GuardSession.build(GuardConfig(), LoopHost(loop), total_steps=1000,
                                 kl=KLSetup(target_kl=0.015, kl_coef=0.05), keys=KEYS)

A host that cannot do something live (verl: the lr, the gradient clip or the KL-loss coefficient need a relaunch)
does it its own way in its adapter, e.g. by saving it for the next launch.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from klguard.guard.signals import REF_KL


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
        """Print one line to the user (the process that prints, only): the session says a pause this way."""


class KLCoefController(Protocol):
    """A KL controller the session steps (klguard.algo.kl's controllers), the host's or its own."""

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


@dataclass(frozen=True)
class KLSetup:
    """What a host knows of its KL control (klguard.config.roles.kl_setup reads it from a verl-style config)."""

    target_kl: float | None = None  # the controller's target (None: klguard.guard.default_target_kl for one node)
    kl_coef: float | None = None  # the steered coefficient's start (None: learnt from the metrics)
    controlled: bool = True  # a controller pursues target_kl (False: a fixed coefficient)
    metric: str = REF_KL  # the per-token KL the KL rules read when a step has it


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
