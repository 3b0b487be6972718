"""What a checkpoint holds and how a run resumes from it, so resume equals an uninterrupted run.

Saved: policy and critic as HF folders, optimizer and LR-schedule states, the KL controller, the
prompt sampler's position, every RNG, the step counter, the guard's state and, with a reward model, its feature
baseline (`rm_outliers.pt`, klguard.reward.rm_outliers). Sharded models (torchrun) are saved with
torch.distributed.checkpoint instead: `actor/`, `critic/` (and `ref/`) hold each rank's shards plus
`huggingface/` (config, tokenizer) for `klguard export`, and `actor_optim/`, `critic_optim/` the optimizer
shards. Either layout resumes at any number of ranks.
"""

from __future__ import annotations

import random
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from torch.distributed.tensor import DTensor

from klguard.distributed import DistContext, any_rank
from klguard.distributed.fsdp import is_sharded
from klguard.distributed.sharded_checkpoint import is_dcp, load_optimizer, load_weights, save_model, save_optimizer
from klguard.errors import UserError
from klguard.model.loading import load_critic, load_policy
from klguard.runtime.checkpoint import (
    STATE_FILE,
    CheckpointManager,
    load_state,
    load_tensors,
    save_tensors,
    verify_checkpoint,
)

if TYPE_CHECKING:
    from klguard.config.schema import Config
    from klguard.ppo.state import TrainState


def _local_non_finite(state: TrainState) -> str | None:
    for prefix, model in state.models():
        for name, param in model.named_parameters():
            if not torch.isfinite(param.to_local() if isinstance(param, DTensor) else param).all():
                return f"{prefix} weight {name}"
    return None


def _first_non_finite(state: TrainState) -> str | None:
    """The first non-finite weight (every rank gets an answer when any rank's shard has one)."""
    bad = _local_non_finite(state)
    return (bad or "a weight shard of another rank") if any_rank(bad is not None) else None


def _save_model(model: torch.nn.Module, folder: Path, tokenizer, dist: DistContext) -> None:
    """An HF folder (rank 0), or, sharded, every rank's shards plus `huggingface/` (config and tokenizer)."""
    if is_sharded(model):
        save_model(model, folder)
        folder = folder / "huggingface"
        if dist.is_main:
            model.config.save_pretrained(folder)
            if getattr(model, "generation_config", None) is not None:
                model.generation_config.save_pretrained(folder)
    elif dist.is_main:
        model.save_pretrained(folder, safe_serialization=True)
    if tokenizer is not None and dist.is_main:
        tokenizer.save_pretrained(folder)


def _save_optimizer(model: torch.nn.Module, optim: torch.optim.Optimizer, folder: Path, name: str,
                    dist: DistContext) -> None:
    if is_sharded(model):
        save_optimizer(model, optim, folder / f"{name}_optim")
    elif dist.is_main:
        save_tensors(optim.state_dict(), folder / f"{name}_optim.pt")


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
RM_OUTLIERS_FILE = "rm_outliers.pt"
"""A checkpoint's reward-model feature baseline (klguard.reward.rm_outliers), with a reward model only."""


class Checkpoints:
    """The run directory's checkpoints: save a TrainState, resume it, roll its weights back to one of them.

    `policy_path` and `config` rebuild a model whose checkpoint holds HF folders (or, with no stable checkpoint yet,
    the initial policy)."""

    def __init__(self, run_dir: Path, max_to_keep: int | None, dist: DistContext | None = None, *,
                 config: Config | None = None, policy_path: Path | None = None, log=print) -> None:
        self.dist = dist or DistContext()
        self.manager = CheckpointManager(run_dir, max_to_keep, dist=self.dist)
        self.config, self.policy_path, self.log = config, policy_path, log

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

    def save(self, state: TrainState, *, guard_state: dict, tokenizer, keep: Iterable[int] = (),
             save_reference: bool = False) -> Path | None:
        """Write a checkpoint unless a weight is not finite (a NaN is never written to disk); retention spares the
        checkpoints of the steps in `keep`. `save_reference`: the reference is no longer the initial policy (a
        rollback re-anchored it), so the checkpoint holds its weights."""
        bad = _first_non_finite(state)
        if bad is not None:
            self.log(f"klguard: checkpoint at step {state.step} skipped: {bad} is not finite")
            return None

        def write(folder: Path) -> None:  # on every rank
            _save_model(state.actor, folder / "actor", tokenizer, self.dist)
            _save_optimizer(state.actor, state.actor_optim, folder, "actor", self.dist)
            if state.critic is not None:
                _save_model(state.critic, folder / "critic", None, self.dist)
                _save_optimizer(state.critic, state.critic_optim, folder, "critic", self.dist)
            if state.ref is not None and save_reference:
                _save_model(state.ref, folder / REFERENCE_DIR, None, self.dist)
            if state.rm_outliers is not None and self.dist.is_main:
                save_tensors(state.rm_outliers.state_dict(), folder / RM_OUTLIERS_FILE)

        saved = {**state.state_dict(), "rng": rng_state(), "guard": guard_state}
        return self.manager.save(state.step, write, saved, keep)

    def restore(self, folder: Path, state: TrainState) -> dict:
        """Resume `state` from `folder`: sharded weights, optimizers, schedules, controller, sampler and the RNGs
        (the caller loaded the models from the checkpoint's HF folders, or built them to take its DCP shards here).
        Returns the guard's saved state (its session's, klguard.guard.session)."""
        saved = load_state(folder)
        try:
            models = (("actor", state.actor), ("critic", state.critic), (REFERENCE_DIR, state.ref))
            for name, model in models:
                if model is not None and is_dcp(folder / name):
                    load_weights(model, folder / name, fresh=None)
            _load_optimizers(folder, state)
            state.load_state_dict(saved)
            self._restore_rm_outliers(folder, state)
            set_rng_state(saved["rng"])
            return saved["guard"]
        except (KeyError, ValueError, TypeError) as exc:
            raise UserError(f"checkpoint {folder} does not fit this run ({type(exc).__name__}: {exc}); "
                            "set trainer.resume_mode=disable or another trainer.default_local_dir") from None

    def _restore_rm_outliers(self, folder: Path, state: TrainState) -> None:
        """The reward model's feature baseline; a checkpoint without one (its run scored without a reward model)
        leaves the baseline to be collected from here on."""
        if state.rm_outliers is None:
            return
        if (folder / RM_OUTLIERS_FILE).is_file():
            state.rm_outliers.load_state_dict(load_tensors(folder / RM_OUTLIERS_FILE))
        else:
            self.log(f"klguard: {folder} holds no reward-model feature baseline; it is collected from this step on")

    def restore_weights(self, folder: Path, state: TrainState) -> int:
        """Rollback: weights, optimizer states and schedules only (the caller applies the lr scale); returns the
        checkpoint's step."""
        saved = load_state(folder)
        cfg, device = self.config, self.dist.device
        load_weights(state.actor, folder / "actor",
                     lambda: load_policy(folder / "actor", cfg, trainable=True, device=device))
        if state.critic is not None:
            load_weights(state.critic, folder / "critic",
                         lambda: load_critic(self.policy_path, cfg, device=device, resume_path=folder / "critic"))
        _load_optimizers(folder, state)
        state.load_schedules(saved)
        return int(saved["global_step"])

    def rollback_to(self, step: int, state: TrainState) -> int | None:
        """Restore the weights and optimizer states of checkpoint `step`; None when it is gone, damaged or not
        trusted (newer than the latest pointer). The step counter, data position and guard state go on."""
        if step not in self.manager.candidates() or not self.manager.is_valid(step):
            return None
        folder = self.manager.path(step)
        restored = self.restore_weights(folder, state)
        self.log(f"klguard: rolled back to {folder}")
        return restored

    def rollback_to_initial(self, state: TrainState) -> int:
        """Restore the initial policy (and critic) with fresh optimizer states; returns 0, its step."""
        cfg, device = self.config, self.dist.device
        load_weights(state.actor, None, lambda: load_policy(self.policy_path, cfg, trainable=True, device=device))
        if state.critic is not None:
            load_weights(state.critic, None, lambda: load_critic(self.policy_path, cfg, device=device))
        for optim in (state.actor_optim, state.critic_optim):
            if optim is not None:
                optim.state.clear()
        self.log("klguard: rolled back to the initial policy (no stable checkpoint yet)")
        return 0


def _load_optimizers(folder: Path, state: TrainState) -> None:
    load_optimizer(state.actor, state.actor_optim, folder / "actor_optim",
                   lambda: load_tensors(folder / "actor_optim.pt"))
    if state.critic is not None:
        load_optimizer(state.critic, state.critic_optim, folder / "critic_optim",
                       lambda: load_tensors(folder / "critic_optim.pt"))

