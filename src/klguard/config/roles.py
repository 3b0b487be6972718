"""The models a run builds (actor, reference, critic), how each is split over the ranks, and which KL coefficient
the controller steers (and so what the guard knows of the run's KL control: `kl_setup`).

Tensor parallelism (`strategy: fsdp_turbo`) runs on one (dp, tp) grid whose tp size is the actor's. The
reference and the critic are split over the same tp ranks (their default follows the actor's), or kept whole on
each of them with tp = 1; any other size is refused.
"""

from __future__ import annotations

from klguard.config.schema import Config
from klguard.config.schema_policy import ACTOR_TP_KEY
from klguard.fields import fail
from klguard.guard import KLSetup
from klguard.guard.signals import KL_UNIT_METRICS, REF_KL

ROLES = ("actor", "ref", "critic")
KL_CTRL_COEF, KL_LOSS_COEF = "algorithm.kl_ctrl.kl_coef", "actor_rollout_ref.actor.kl_loss_coef"
_TP_SUFFIX = ".turbo_config.distributed.tensor_parallel_size"
SHARDING_KEYS = {"actor": "actor_rollout_ref.actor.fsdp_config", "ref": "actor_rollout_ref.ref.fsdp_config",
                 "critic": "critic.model.fsdp_config"}
STRATEGY_KEYS = {"actor": "actor_rollout_ref.actor.strategy", "ref": "actor_rollout_ref.actor.strategy",
                 "critic": "critic.strategy"}
assert SHARDING_KEYS["actor"] + _TP_SUFFIX == ACTOR_TP_KEY


def uses_critic(cfg: Config) -> bool:
    """critic.enable, or (null) whether the advantage estimator is GAE."""
    return cfg.critic.enable if cfg.critic.enable is not None else cfg.algorithm.adv_estimator == "gae"


def uses_reference(cfg: Config) -> bool:
    """The reference policy is needed for the KL in the reward, for the KL loss, or for PAR shaping (its responses'
    reward)."""
    return (cfg.algorithm.use_kl_in_reward or cfg.actor_rollout_ref.actor.use_kl_loss
            or cfg.reward_model.shaping == "par")


def steers_kl_loss(cfg: Config) -> bool:
    """The KL controller (and the guard's raise/lower actions) drive the KL-loss coefficient: the KL is a loss only
    (GRPO style). With the KL in the reward too, they drive the in-reward coefficient and the loss's stays fixed."""
    return cfg.actor_rollout_ref.actor.use_kl_loss and not cfg.algorithm.use_kl_in_reward


def kl_controlled(cfg: Config, *, loss_steered: bool = True) -> bool:
    """Some coefficient is steered, and by a controller that pursues target_kl (not a fixed one). `loss_steered`: the
    controller steers the KL loss's coefficient when the KL is a loss only (klguard's trainer; verl's does not)."""
    steered = cfg.algorithm.use_kl_in_reward or (loss_steered and steers_kl_loss(cfg))
    return cfg.algorithm.kl_ctrl.type != "fixed" and bool(steered)


def guard_kl_metric(cfg: Config) -> str:
    """The per-token KL the guard's KL rules read: the controller's, when it steers on the batch's token mean;
    else verl's mean over sequences of each one's token mean (a ``seq_sum`` target is not per token; verl's config has
    no ``kl_unit``)."""
    unit = getattr(cfg.algorithm.kl_ctrl, "kl_unit", None)
    return KL_UNIT_METRICS[unit] if unit == "batch_token_mean" else REF_KL


def kl_coef_key(cfg: Config, *, loss_steered: bool = True) -> str:
    """The coefficient the controller and the guard's raises drive: the in-reward one with the KL in the reward, the KL
    loss's with the KL a loss only; with neither, klguard's kl_ctrl.kl_coef (verl's guard: the KL loss's, which it
    saves for the next launch)."""
    if cfg.algorithm.use_kl_in_reward or (loss_steered and not steers_kl_loss(cfg)):
        return KL_CTRL_COEF
    return KL_LOSS_COEF


def initial_kl_coef(cfg: Config, *, loss_steered: bool = True) -> float:
    """The steered coefficient's starting value: actor.kl_loss_coef when the KL is a loss only, else kl_ctrl's."""
    node = cfg
    for part in kl_coef_key(cfg, loss_steered=loss_steered).split("."):
        node = getattr(node, part)
    return float(node)


def kl_setup(cfg: Config, *, loss_steered: bool = True) -> KLSetup:
    """What the guard must know of the run's KL control, from klguard's config or verl's (the same key tree)."""
    return KLSetup(target_kl=float(cfg.algorithm.kl_ctrl.target_kl),
                   kl_coef=initial_kl_coef(cfg, loss_steered=loss_steered),
                   controlled=kl_controlled(cfg, loss_steered=loss_steered), metric=guard_kl_metric(cfg))


def sharding(cfg: Config, role: str):
    arr = cfg.actor_rollout_ref
    return {"actor": arr.actor.fsdp_config, "ref": arr.ref.fsdp_config, "critic": cfg.critic.model.fsdp_config}[role]


def strategy(cfg: Config, role: str) -> str:
    """The role's strategy; the reference follows the actor's (as verl's ref.strategy)."""
    return cfg.critic.strategy if role == "critic" else cfg.actor_rollout_ref.actor.strategy


def tp_key(role: str) -> str:
    return SHARDING_KEYS[role] + _TP_SUFFIX


def role_tp(cfg: Config, role: str) -> int:
    return sharding(cfg, role).turbo_config.distributed.tensor_parallel_size


def run_tp(cfg: Config) -> int:
    """The tp size of the run's (dp, tp) grid: the actor's."""
    return role_tp(cfg, "actor")


def built_roles(cfg: Config) -> tuple[str, ...]:
    return ("actor",) + (("ref",) if uses_reference(cfg) else ()) + (("critic",) if uses_critic(cfg) else ())


def check_parallel(cfg: Config) -> None:
    """Each built model's tp size is the run's or 1, and only strategy fsdp_turbo splits a model."""
    tp = run_tp(cfg)
    for role in built_roles(cfg):
        size = role_tp(cfg, role)
        if size > 1 and strategy(cfg, role) != "fsdp_turbo":
            fail(tp_key(role), size, f"needs {STRATEGY_KEYS[role]}=fsdp_turbo (got {strategy(cfg, role)}), or set "
                 "it to 1")
        if role != "actor" and size not in (1, tp):
            fail(tp_key(role), size, f"must be the actor's tensor_parallel_size ({tp}) or 1: klguard runs one "
                 "(dp, tp) mesh")
    if tp > 1 and cfg.reward_model.shaping == "par":
        fail("reward_model.shaping", "par", "is not supported with tensor parallelism (the reference policy would "
             "generate on its tp shards)")
    if tp > 1 and cfg.actor_rollout_ref.model.lora_rank > 0:
        fail("actor_rollout_ref.model.lora_rank", cfg.actor_rollout_ref.model.lora_rank, "is not supported with "
             f"tensor parallelism ({tp_key('actor')}={tp}): set it to 0, or train on FSDP2 alone")
    rollout_tp = cfg.actor_rollout_ref.rollout.tensor_model_parallel_size
    if tp > 1 and rollout_tp not in (1, tp):
        fail("actor_rollout_ref.rollout.tensor_model_parallel_size", rollout_tp,
             f"must be 1 (a whole copy per rank) or the actor's tensor_parallel_size ({tp})")
