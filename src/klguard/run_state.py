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
    verify_checkpoint,
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


REFERENCE_DIR = "ref"
"""A checkpoint's reference policy, written only once a rollback re-anchored it (otherwise the
reference is the initial policy, loaded from the model path)."""


class RunState:
    def __init__(self, run_dir: Path, max_to_keep: int | None) -> None:
        self.manager = CheckpointManager(run_dir, max_to_keep)

    def find_resume_checkpoint(self, mode: str, path: str | None) -> Path | None:
        if mode == "disable":
            return None
        if mode == "resume_path":
            folder = Path(path).expanduser()
            if not (folder / STATE_FILE).is_file():
                raise UserError(f"trainer.resume_from_path={path} is not a klguard checkpoint (no {STATE_FILE})")
            why = verify_checkpoint(folder)
            if why is not None:
                raise UserError(f"trainer.resume_from_path={path} is a damaged checkpoint: {why}")
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
            if trainer.ref is not None and trainer.reference_step != 0:  # re-anchored by a guard rollback
                trainer.ref.save_pretrained(folder / REFERENCE_DIR, safe_serialization=True)

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
            "reference_step": trainer.reference_step,
        }
        return self.manager.save(trainer.global_step, write, state)

    def mark_stable(self, step: int) -> None:
        """Mark checkpoint `step` stable: the rollout that followed it kept every guard rule quiet."""
        self.manager.mark_stable(step)

    def latest_stable(self) -> Path | None:
        """The newest whole checkpoint confirmed stable (see mark_stable)."""
        for step in self.manager.candidates():
            if self.manager.is_stable(step) and self.manager.is_valid(step):
                return self.manager.path(step)
        return None

    def restore(self, folder: Path, trainer: PPOTrainer) -> int:
        """Resume: optimizer, schedule, controller, guard, sampler and RNG state (the caller loaded the
        models from the checkpoint's HF folders)."""
        state = load_state(folder)
        try:
            self._load_optimizers(folder, state, trainer)
            trainer.kl_ctrl.load_state_dict(state["kl_ctrl"])
            trainer.sampler.load_state_dict(state["sampler"])
            trainer.guard.load_state_dict(state["guard"])
            trainer.lr_scale, trainer.kl_frozen = state["lr_scale"], state["kl_frozen"]
            trainer.actor_grad_clip = state["actor_grad_clip"]
            trainer.reference_step = int(state.get("reference_step", 0))
            trainer.apply_lr_scale()
            set_rng_state(state["rng"])
            return int(state["global_step"])
        except (KeyError, ValueError, TypeError) as exc:
            raise UserError(f"checkpoint {folder} does not fit this run ({type(exc).__name__}: {exc}); "
                            "set trainer.resume_mode=disable or another trainer.default_local_dir") from None

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


def truncate_logs(run_dir: Path, step: int) -> None:
    """On resume from checkpoint `step`, drop the lines of `metrics.jsonl` and `events.jsonl` that a
    killed run wrote after it (and any torn last line), so every step appears once, as resumed."""
    for name in ("metrics.jsonl", "events.jsonl"):
        path = Path(run_dir) / name
        if not path.is_file():
            continue
        kept = []
        for line in path.read_text(encoding="utf-8").splitlines():
            try:
                record = json.loads(line)
            except ValueError:
                continue
            if isinstance(record, dict) and int(record.get("step", 0)) <= step:
                kept.append(line + "\n")
        atomic_write_text(path, "".join(kept))
