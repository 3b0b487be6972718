"""TrainState: everything a PPO run changes as it trains, in one typed object.

Setup builds it (klguard.ppo.setup.build_train_state), the loop reads and advances it, checkpointing saves and
restores it (klguard.ppo.checkpointing) and the guard's actions adjust it (klguard.ppo.guard_host); none of them
needs the trainer. `state_dict()` holds its plain values (step, KL controller, sampler position, LR schedules);
the models' weights and the optimizers' moments are tensors, which checkpointing writes as safetensors or, sharded,
with torch.distributed.checkpoint; the reward model's feature baseline (`rm_outliers`) has a tensor file of its own.
What the guard sets besides the KL controller (the lr scale, the gradient clip, the warm-up's freeze, the reference's
step) lives in the guard's state (klguard.guard.session), saved beside this.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import torch

from klguard.algo.kl import KLController
from klguard.data.sampler import PromptSampler
from klguard.model.lora import adapters_off
from klguard.reward.rm_outliers import RMFeatureOutliers

Scheduler = torch.optim.lr_scheduler.LRScheduler


@dataclass(eq=False)
class TrainState:
    actor: torch.nn.Module
    actor_optim: torch.optim.Optimizer
    actor_sched: Scheduler
    kl_ctrl: KLController
    sampler: PromptSampler
    ref: torch.nn.Module | None = None  # frozen; None when neither KL in the reward nor a KL loss needs it
    critic: torch.nn.Module | None = None
    critic_optim: torch.optim.Optimizer | None = None
    critic_sched: Scheduler | None = None
    step: int = 0  # PPO steps done
    rm_outliers: RMFeatureOutliers | None = None  # with a reward model: its feature baseline (a tensor file)
    ref_in_actor: bool = False  # LoRA: the reference is the actor with its adapters off (`ref` is None)

    @property
    def has_reference(self) -> bool:
        """Whether the run has a reference policy (a model of its own, or the LoRA actor's base)."""
        return self.ref is not None or self.ref_in_actor

    @contextmanager
    def reference(self) -> Iterator[torch.nn.Module]:
        """The reference policy for the block: `ref`, or the LoRA actor with its adapters off."""
        if self.ref is not None:
            yield self.ref
            return
        if not self.ref_in_actor:
            raise RuntimeError("this run has no reference policy")
        with adapters_off(self.actor):
            yield self.actor

    def models(self) -> list[tuple[str, torch.nn.Module]]:
        """The trained models by name: actor, and critic when there is one."""
        return [(name, model) for name, model in (("actor", self.actor), ("critic", self.critic)) if model is not None]

    def apply_lr_scale(self, scale: float) -> None:
        """Scheduled lr times the guard's `scale` (LambdaLR recomputes from base lrs every step)."""
        for group, base in zip(self.actor_optim.param_groups, self.actor_sched.get_last_lr(), strict=True):
            group["lr"] = base * scale

    def load_schedules(self, state: dict[str, Any]) -> None:
        self.actor_sched.load_state_dict(state["actor_sched"])
        if self.critic_sched is not None:
            self.critic_sched.load_state_dict(state["critic_sched"])

    def state_dict(self) -> dict[str, Any]:
        return {
            "global_step": self.step,
            "kl_ctrl": self.kl_ctrl.state_dict(),
            "sampler": self.sampler.state_dict(),
            "actor_sched": self.actor_sched.state_dict(),
            "critic_sched": self.critic_sched.state_dict() if self.critic_sched is not None else None,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """The values of `state_dict()` (the caller then applies the guard's lr scale); raises
        KeyError/ValueError/TypeError on a state of another kind of run."""
        self.load_schedules(state)
        self.kl_ctrl.load_state_dict(state["kl_ctrl"])
        self.sampler.load_state_dict(state["sampler"])
        self.step = int(state["global_step"])
