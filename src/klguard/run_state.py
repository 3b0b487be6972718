"""What a checkpoint holds and how a run resumes from it, so resume equals an uninterrupted run.

Saved: policy and critic as HF folders, optimizer and LR-schedule states, the KL controller, the
prompt sampler's position, every RNG and the step counter.
"""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from klguard.checkpoint import (
    STATE_FILE,
    CheckpointManager,
    atomic_write_text,
    load_state,
    load_tensors,
    save_tensors,
)
from klguard.errors import UserError

if TYPE_CHECKING:
    from klguard.trainer import PPOTrainer


def _first_non_finite(trainer: PPOTrainer) -> str | None:
    for prefix, model in (("actor", trainer.actor), ("critic", trainer.critic)):
        if model is None:
            continue
        for name, param in model.named_parameters():
            if not torch.isfinite(param).all():
                return f"{prefix} weight {name}"
    return None


def rng_state() -> dict[str, Any]:
    np_state = np.random.get_state()
    return {
        "python": [random.getstate()[0], list(random.getstate()[1]), random.getstate()[2]],
        "numpy": [np_state[0], np_state[1].tolist(), int(np_state[2]), int(np_state[3]), float(np_state[4])],
        "torch": torch.get_rng_state().tolist(),
    }


def set_rng_state(state: dict[str, Any]) -> None:
    version, internal, gauss = state["python"]
    random.setstate((version, tuple(internal), gauss))
    name, keys, pos, has_gauss, cached = state["numpy"]
    np.random.set_state((name, np.array(keys, dtype=np.uint32), pos, has_gauss, cached))
    torch.set_rng_state(torch.tensor(state["torch"], dtype=torch.uint8))


class RunState:
    def __init__(self, run_dir: Path, max_to_keep: int | None) -> None:
        self.manager = CheckpointManager(run_dir, max_to_keep)

    def find_resume_checkpoint(self, mode: str, path: str | None) -> Path | None:
        if mode == "disable":
            return None
        if mode == "resume_path":
            folder = Path(path).expanduser()
            if not (folder / "trainer_state.json").is_file():
                raise UserError(f"trainer.resume_from_path={path} is not a klguard checkpoint (no trainer_state.json)")
            return folder
        return self.manager.latest()

    def save(self, trainer: PPOTrainer) -> Path | None:
        """Write a checkpoint unless a weight is not finite (a NaN is never written to disk)."""
        bad = _first_non_finite(trainer)
        if bad is not None:
            trainer.log(f"klguard: checkpoint at step {trainer.global_step} skipped: {bad} is not finite")
            return None

        def write(folder: Path) -> None:
            trainer.actor.save_pretrained(folder / "actor", safe_serialization=True)
            trainer.tokenizer.save_pretrained(folder / "actor")
            save_tensors(trainer.actor_optim.state_dict(), folder / "actor_optim.pt")
            if trainer.critic is not None:
                trainer.critic.save_pretrained(folder / "critic", safe_serialization=True)
                save_tensors(trainer.critic_optim.state_dict(), folder / "critic_optim.pt")

        state = {
            "global_step": trainer.global_step,
            "kl_ctrl": trainer.kl_ctrl.state_dict(),
            "sampler": trainer.sampler.state_dict(),
            "actor_sched": trainer.actor_sched.state_dict(),
            "critic_sched": trainer.critic_sched.state_dict() if trainer.critic_sched else None,
            "rng": rng_state(),
            "guard": trainer.guard.state_dict(),
            "stable": False,  # confirmed by mark_stable() once the next step has measured these weights
            "lr_scale": trainer.lr_scale,
            "actor_grad_clip": trainer.actor_grad_clip,
            "kl_frozen": trainer.kl_frozen,
        }
        return self.manager.save(trainer.global_step, write, state)

    def mark_stable(self, step: int) -> None:
        """Mark checkpoint `step` stable: the rollout that followed it kept every guard rule quiet."""
        folder = self.manager.path(step)
        if (folder / STATE_FILE).is_file():
            state = load_state(folder)
            state["stable"] = True
            atomic_write_text(folder / STATE_FILE, json.dumps(state, indent=1, sort_keys=True))

    def latest_stable(self) -> Path | None:
        """The newest checkpoint confirmed stable (see mark_stable)."""
        for step in reversed(self.manager.steps()):
            if load_state(self.manager.path(step)).get("stable", False):
                return self.manager.path(step)
        return None

    def restore(self, folder: Path, trainer: PPOTrainer) -> int:
        """Resume: optimizer, schedule, controller, guard, sampler and RNG state (the caller loaded the
        models from the checkpoint's HF folders)."""
        state = load_state(folder)
        self._load_optimizers(folder, state, trainer)
        trainer.kl_ctrl.load_state_dict(state["kl_ctrl"])
        trainer.sampler.load_state_dict(state["sampler"])
        trainer.guard.load_state_dict(state["guard"])
        trainer.lr_scale, trainer.kl_frozen = state["lr_scale"], state["kl_frozen"]
        trainer.actor_grad_clip = state["actor_grad_clip"]
        trainer.apply_lr_scale()
        set_rng_state(state["rng"])
        return int(state["global_step"])

    def restore_weights(self, folder: Path, trainer: PPOTrainer) -> int:
        """Rollback: weights and optimizer states only; returns the checkpoint's step."""
        from klguard.model.loading import load_critic, load_policy

        state = load_state(folder)
        fresh = load_policy(folder / "actor", trainer.cfg, trainable=True, device=trainer.device)
        trainer.actor.load_state_dict(fresh.state_dict())
        if trainer.critic is not None:
            critic = load_critic(trainer.policy_path, trainer.cfg, device=trainer.device, resume_path=folder / "critic")
            trainer.critic.load_state_dict(critic.state_dict())
        self._load_optimizers(folder, state, trainer)
        trainer.apply_lr_scale()
        return int(state["global_step"])

    @staticmethod
    def _load_optimizers(folder: Path, state: dict, trainer: PPOTrainer) -> None:
        trainer.actor_optim.load_state_dict(load_tensors(folder / "actor_optim.pt"))
        trainer.actor_sched.load_state_dict(state["actor_sched"])
        if trainer.critic is not None:
            trainer.critic_optim.load_state_dict(load_tensors(folder / "critic_optim.pt"))
            trainer.critic_sched.load_state_dict(state["critic_sched"])
