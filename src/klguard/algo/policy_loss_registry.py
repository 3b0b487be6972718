"""Policy losses by name, one signature for all (verl's `register_policy_loss` / `get_policy_loss_fn` is the model).

A policy loss takes the rollout-time and current log-probs, the advantages and the response mask of a micro-batch
and returns a `PolicyLossOutput` (the aggregated loss and its diagnostics). It is selected by
`actor_rollout_ref.actor.policy_loss.loss_mode`; a new one is a function decorated with
`@register_policy_loss("name")`, nothing in the update changes. verl's other losses are in
klguard.algo.policy_losses_verl, registered when klguard.algo is imported.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

from torch import Tensor

from klguard.algo.loss import PolicyLossOutput, compute_policy_loss
from klguard.algo.registry import Registry


class PolicyLossOptions(Protocol):
    """The keys under `actor.policy_loss` a loss may read (klguard's PolicyLossConfig, verl's names)."""

    loss_mode: str
    clip_cov_ratio: float
    clip_cov_lb: float
    clip_cov_ub: float
    kl_cov_ratio: float
    ppo_kl_coef: float
    dro_beta: float | None


class PolicyLossSettings(Protocol):
    """The actor settings a policy loss may read (klguard's ActorConfig has them all, under verl's names)."""

    clip_ratio: float
    clip_ratio_low: float | None
    clip_ratio_high: float | None
    clip_ratio_c: float
    use_dual_clip: bool
    loss_agg_mode: str
    tau_pos: float
    tau_neg: float

    # read-only here, so that ActorConfig's PolicyLossConfig field matches the protocol
    @property
    def policy_loss(self) -> PolicyLossOptions: ...


PolicyLossFn = Callable[[Tensor, Tensor, Tensor, Tensor, PolicyLossSettings], PolicyLossOutput]
"""(old_logprob, logprob, advantages, response_mask, settings) -> PolicyLossOutput; tensors are [B, R]."""

_POLICY_LOSSES: Registry[PolicyLossFn] = Registry("policy loss")


def register_policy_loss(name: str) -> Callable[[PolicyLossFn], PolicyLossFn]:
    """Decorator: make `fn` the policy loss called `name` (a name is registered once)."""
    return _POLICY_LOSSES.register(name)


def policy_loss_names() -> tuple[str, ...]:
    return _POLICY_LOSSES.names()


def get_policy_loss(name: str) -> PolicyLossFn:
    return _POLICY_LOSSES.get(name)


@register_policy_loss("vanilla")
def vanilla_policy_loss(old_logprob: Tensor, logprob: Tensor, advantages: Tensor, response_mask: Tensor,
                        settings: PolicyLossSettings) -> PolicyLossOutput:
    """PPO's clipped surrogate with the optional dual clip (`compute_policy_loss`)."""
    return compute_policy_loss(old_logprob, logprob, advantages, response_mask, clip_ratio=settings.clip_ratio,
                               clip_ratio_low=settings.clip_ratio_low, clip_ratio_high=settings.clip_ratio_high,
                               clip_ratio_c=settings.clip_ratio_c, use_dual_clip=settings.use_dual_clip,
                               loss_agg_mode=settings.loss_agg_mode)
