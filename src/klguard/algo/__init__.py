"""Pure-tensor RLHF algorithm core: KL estimators and controllers, advantages, PPO losses.

No I/O, no distributed code, no model code: every function maps tensors to tensors. Policy losses, advantage
estimators and KL controllers are registered by decorator (klguard.algo.registry), each with the inputs it needs.
"""

# imported for their registrations: any import of the registry imports this package first, so they are there
from klguard.algo import policy_losses_verl  # noqa: F401
from klguard.algo.advantage import ADV_ESTIMATORS, GROUP_ESTIMATORS, compute_advantage, compute_gae
from klguard.algo.advantage_registry import adv_estimator_inputs, register_adv_est
from klguard.algo.kl import (
    KL_CONTROLLERS,
    KL_ESTIMATORS,
    AdaptiveKLController,
    FixedKLController,
    build_kl_controller,
    kl_controller_inputs,
    kl_penalty,
    register_kl_controller,
)
from klguard.algo.loss import (
    LOSS_AGG_MODES,
    PolicyLossOutput,
    agg_loss,
    compute_policy_loss,
    compute_value_loss,
    entropy_from_logits,
    logprobs_from_logits,
)
from klguard.algo.policy_loss_registry import get_policy_loss, policy_loss_names, register_policy_loss
from klguard.algo.stats import masked_mean, masked_sum, masked_var, masked_whiten

__all__ = [
    "ADV_ESTIMATORS",
    "GROUP_ESTIMATORS",
    "KL_CONTROLLERS",
    "KL_ESTIMATORS",
    "LOSS_AGG_MODES",
    "AdaptiveKLController",
    "FixedKLController",
    "PolicyLossOutput",
    "adv_estimator_inputs",
    "agg_loss",
    "build_kl_controller",
    "compute_advantage",
    "compute_gae",
    "compute_policy_loss",
    "compute_value_loss",
    "entropy_from_logits",
    "get_policy_loss",
    "kl_controller_inputs",
    "kl_penalty",
    "logprobs_from_logits",
    "masked_mean",
    "masked_sum",
    "masked_var",
    "masked_whiten",
    "policy_loss_names",
    "register_adv_est",
    "register_kl_controller",
    "register_policy_loss",
]
