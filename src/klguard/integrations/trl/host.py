"""TRL's GRPOTrainer as the host of the guard's session (klguard.guard.GuardHost): what each action does to a live
trainer, and how TRL's user spells the settings a pause names. Every process applies the actions (they follow
from the same gathered metrics); the main process writes and prints them."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tqdm import tqdm

from klguard.guard import HostKeys
from klguard.integrations.trl import trainer_ops
from klguard.runtime.events import append_event

TRL_KEYS = HostKeys(kl_coef="GRPOConfig beta", lr="learning_rate", save_freq="save_steps",
                    resume="resume_from_checkpoint")


class TRLHost:
    """The guard's actions on a GRPOTrainer: beta (``trainer.beta``), the learning rates (param groups and the
    scheduler's base rates), gradient clipping (``args.max_grad_norm``), a rollback to a checkpoint folder,
    re-anchoring the reference, a pause (a checkpoint, then a clean stop). ``control``: the TrainerControl of the
    event being handled."""

    def __init__(self, trainer) -> None:
        self.trainer = trainer
        self.output_dir = Path(trainer.args.output_dir)
        self.events_path = self.output_dir / "events.jsonl"
        self.control = None

    def set_kl_coef(self, value: float | None, *, frozen: bool) -> None:
        if value is not None:  # the session's controller holds it, frozen or not
            self.trainer.beta = value

    def set_target_kl(self, value: float) -> None:
        pass  # the session's controller took it

    def set_lr_scale(self, scale: float, ratio: float) -> None:
        trainer_ops.scale_lr(self.trainer, ratio)

    def set_grad_clip(self, clip: float) -> None:
        trainer_ops.set_grad_clip(self.trainer, clip)

    def restore_checkpoint(self, step: int) -> int | None:
        folder = self.output_dir / f"checkpoint-{step}"
        if not folder.is_dir():  # save_total_limit deleted it
            return None
        trainer_ops.restore_checkpoint(self.trainer, folder)
        self.say(f"klguard: rolled back to {folder}")
        return step

    def restore_reference(self, reference_step: int) -> int | None:
        if not trainer_ops.can_restore_reference(self.trainer):
            return None
        trainer_ops.restore_reference(self.trainer)
        self.say(f"klguard: rolled back to the reference policy (step {reference_step}): no stable checkpoint, "
                 "none saved yet or none with the KL within half the hard limit (save_steps sets how often TRL saves)")
        return reference_step

    def reanchor_reference(self, step: int) -> None:
        if not trainer_ops.reanchor_reference(self.trainer):
            self.say("klguard: this trainer has no separate reference model (PEFT): not re-anchored")

    def pause(self, reason: str) -> None:
        self.control.should_save = True
        self.control.should_training_stop = True

    def write_event(self, record: dict[str, Any]) -> None:
        if self.trainer.state.is_world_process_zero:
            append_event(self.events_path, record)

    def say(self, message: str) -> None:
        if self.trainer.state.is_world_process_zero:
            tqdm.write(message)
