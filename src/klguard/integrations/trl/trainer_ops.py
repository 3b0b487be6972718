"""What the guard's actions change in a live TRL trainer: its beta, learning rates, gradient clipping,
weights, optimizer state and reference model. Every call works on every process (each applies the same
actions, which follow from the same gathered metrics)."""

from __future__ import annotations

from pathlib import Path

import torch

from klguard.distributed.sharded_checkpoint import copy_weights


def _copy(trainer, src, dst) -> None:
    """``dst`` takes ``src``'s weights (each unwrapped from accelerate's wrapper)."""
    unwrap = trainer.accelerator.unwrap_model
    with torch.no_grad():
        copy_weights(unwrap(src), unwrap(dst))


def _inner_optimizer(optimizer):
    """accelerate's AcceleratedOptimizer wraps the torch optimizer."""
    return getattr(optimizer, "optimizer", optimizer)


def scale_lr(trainer, ratio: float) -> None:
    """Multiply the live learning rates by ``ratio``, and the scheduler's base rates, so its next step keeps the
    cut (a LambdaLR sets lr = base_lr x lambda(step))."""
    for group in trainer.optimizer.param_groups:
        group["lr"] *= ratio
    scheduler = trainer.lr_scheduler
    if scheduler is not None and hasattr(scheduler, "base_lrs"):
        scheduler.base_lrs = [lr * ratio for lr in scheduler.base_lrs]
        scheduler._last_lr = [group["lr"] for group in trainer.optimizer.param_groups]


def set_grad_clip(trainer, clip: float) -> None:
    """transformers' Trainer reads ``args.max_grad_norm`` at every optimizer step."""
    trainer.args.max_grad_norm = float(clip)


def restore_checkpoint(trainer, folder: Path) -> None:
    """Load a TRL checkpoint's weights and optimizer state into the live trainer. The learning rates and the
    scheduler stay as they are now (the lr schedule, the step counter, the data position and the RNG go on),
    and rollouts buffered from the abandoned policy are dropped. Uses transformers' own checkpoint loaders,
    which know every weight layout it writes (one file, shards, adapters)."""
    lrs = [group["lr"] for group in trainer.optimizer.param_groups]
    scheduler = trainer.lr_scheduler
    scheduler_state = scheduler.state_dict() if scheduler is not None else None
    trainer._load_from_checkpoint(str(folder))
    trainer._load_optimizer_and_scheduler(str(folder))
    if scheduler is not None:
        scheduler.load_state_dict(scheduler_state)
    for group, lr in zip(trainer.optimizer.param_groups, lrs, strict=True):
        group["lr"] = lr
    trainer._buffered_inputs = None


def can_restore_reference(trainer) -> bool:
    """Whether the reference model holds weights the guard knows: the initial policy or a re-anchored stable
    one (not so with TRL's sync_ref_model, which mixes the policy into it, or with PEFT, which has none)."""
    return getattr(trainer, "ref_model", None) is not None and not trainer.args.sync_ref_model


def restore_reference(trainer) -> None:
    """Load the reference model's weights into the policy and start the optimizer afresh (as at step 0)."""
    _copy(trainer, trainer.ref_model, trainer.model)
    _inner_optimizer(trainer.optimizer).state.clear()
    trainer._buffered_inputs = None


def reanchor_reference(trainer) -> bool:
    """Copy the policy into the reference model; False when the trainer has none (PEFT: the reference is the
    base model with the adapter disabled)."""
    if getattr(trainer, "ref_model", None) is None:
        return False
    _copy(trainer, trainer.model, trainer.ref_model)
    return True
