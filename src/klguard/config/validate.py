"""Checks run before any model loads. Each failure is a ConfigError naming the key.

Every section checks its own fields (choices, rules and `check` methods in the schema, run by
klguard.fields.check_tree); what involves several sections is here, and `validate_world` adds the
checks that need the number of ranks.
"""

from __future__ import annotations

from klguard.algo.advantage import GROUP_ESTIMATORS
from klguard.config.batches import resolve_batches
from klguard.config.roles import ROLES, SHARDING_KEYS, check_parallel, run_tp
from klguard.config.roles import sharding as role_sharding
from klguard.config.schema import Config
from klguard.config.schema_policy import ACTOR_TP_KEY
from klguard.fields import check_tree, fail


def validate(cfg: Config) -> None:
    """Raise ConfigError for the first invalid value or inconsistent combination."""
    check_tree(cfg)
    _check_estimator_needs(cfg)
    resolve_batches(cfg)  # verl's batch arithmetic at one rank; validate_world checks it at the run's ranks
    _check_reward_sources(cfg)
    check_parallel(cfg)


def _check_estimator_needs(cfg: Config) -> None:
    estimator, n = cfg.algorithm.adv_estimator, cfg.actor_rollout_ref.rollout.n
    if estimator in GROUP_ESTIMATORS and n < 2:
        fail("actor_rollout_ref.rollout.n", n, f"must be >= 2 for the group estimator {estimator}")
    if cfg.critic.enable is False and estimator == "gae":
        fail("critic.enable", False, "but algorithm.adv_estimator=gae needs a critic")


def _check_reward_sources(cfg: Config) -> None:
    if cfg.reward_model.enable and cfg.proxy_reward.enable:
        fail("proxy_reward.enable", True, "conflicts with reward_model.enable=true (both would set the score)")


def validate_world(cfg: Config, world: int) -> None:
    """Checks that need the number of ranks (torchrun's WORLD_SIZE), run when training starts: the tp size
    divides the world, every mini-batch splits evenly over the data-parallel ranks (world / tp) and the per-rank
    micro-batch divides its share."""
    tp = run_tp(cfg)
    if world % tp:
        fail(ACTOR_TP_KEY, tp, f"must divide the world size {world} (WORLD_SIZE)")
    dp = world // tp
    ranks = f"{dp} data-parallel ranks (WORLD_SIZE {world} / tensor_parallel_size {tp})" if tp > 1 else \
        f"{world} ranks (WORLD_SIZE)"
    resolve_batches(cfg, dp)
    for role in ROLES:
        size = role_sharding(cfg, role).fsdp_size
        if size > 0 and dp % size:
            fail(f"{SHARDING_KEYS[role]}.fsdp_size", size,
                 f"must divide the {ranks}" if tp > 1 else f"must divide the world size {world}")
