"""Checks run before any model loads. Each failure is a ConfigError naming the key.

Every section checks its own fields (choices, rules and `check` methods in the schema, run by
klguard.fields.check_tree); what involves several sections is here, and `validate_world` adds the
checks that need the number of ranks.
"""

from __future__ import annotations

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
    """rollout.n=1 with a group estimator is allowed: as in verl, a group of one has no baseline (docs/verl.md)."""
    estimator = cfg.algorithm.adv_estimator
    if cfg.critic.enable is False and estimator == "gae":
        fail("critic.enable", False, "but algorithm.adv_estimator=gae needs a critic")
    buffer, max_len = cfg.reward_model.reward_kwargs.overlong_buffer_cfg, cfg.data.max_response_length
    end = cfg.reward_model.reward_kwargs.max_resp_len or max_len
    if buffer.enable and buffer.len > end:
        fail("reward_model.reward_kwargs.overlong_buffer_cfg.len", buffer.len,
             f"must be <= max_resp_len ({end}: reward_model.reward_kwargs.max_resp_len or data.max_response_length)")


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
