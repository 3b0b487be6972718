"""Checks run before any model loads. Each failure is a ConfigError naming the key.

Every section checks its own fields (choices, rules and `check` methods in the schema, run by
klguard.fields.check_tree); what involves several sections is here, and `validate_world` adds the
checks that need the number of ranks.
"""

from __future__ import annotations

from typing import Any

from klguard.algo.advantage import GROUP_ESTIMATORS
from klguard.config.roles import ROLES, SHARDING_KEYS, check_parallel, run_tp
from klguard.config.roles import sharding as role_sharding
from klguard.config.schema import Config
from klguard.config.schema_policy import ACTOR_TP_KEY
from klguard.fields import check_tree, fail


def validate(cfg: Config) -> None:
    """Raise ConfigError for the first invalid value or inconsistent combination."""
    check_tree(cfg)
    _check_estimator_needs(cfg)
    _check_batches(cfg)
    _check_reward_sources(cfg)
    check_parallel(cfg)


def _check_estimator_needs(cfg: Config) -> None:
    estimator, n = cfg.algorithm.adv_estimator, cfg.actor_rollout_ref.rollout.n
    if estimator in GROUP_ESTIMATORS and n < 2:
        fail("actor_rollout_ref.rollout.n", n, f"must be >= 2 for the group estimator {estimator}")
    if cfg.critic.enable is False and estimator == "gae":
        fail("critic.enable", False, "but algorithm.adv_estimator=gae needs a critic")


def _update_sections(cfg: Config) -> tuple[tuple[str, Any], ...]:
    return (("actor_rollout_ref.actor", cfg.actor_rollout_ref.actor), ("critic", cfg.critic))


def _check_batches(cfg: Config) -> None:
    """verl's batch arithmetic; a mismatch here is verl #2505's silent grad_norm=NaN."""
    n = cfg.actor_rollout_ref.rollout.n
    train = cfg.data.train_batch_size
    for prefix, section in _update_sections(cfg):
        mini = section.ppo_mini_batch_size
        if train % mini:
            fail(f"{prefix}.ppo_mini_batch_size", mini, f"must divide data.train_batch_size={train}")
        micro = section.ppo_micro_batch_size_per_gpu
        if micro is None:
            continue
        if micro > mini * n:
            fail(f"{prefix}.ppo_micro_batch_size_per_gpu", micro,
                 f"is larger than the mini-batch ({prefix}.ppo_mini_batch_size={mini} x rollout.n={n})")
        if (mini * n) % micro:
            fail(f"{prefix}.ppo_micro_batch_size_per_gpu", micro,
                 f"must divide the mini-batch of {mini * n} rollouts (ppo_mini_batch_size x rollout.n)")


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
    n = cfg.actor_rollout_ref.rollout.n
    for prefix, section in _update_sections(cfg):
        rows = section.ppo_mini_batch_size * n
        if rows % dp:
            fail(f"{prefix}.ppo_mini_batch_size", section.ppo_mini_batch_size,
                 f"x rollout.n={n} = {rows} rollouts does not split evenly over {ranks}")
        micro = section.ppo_micro_batch_size_per_gpu
        if micro is not None and (rows // dp) % micro:
            fail(f"{prefix}.ppo_micro_batch_size_per_gpu", micro,
                 f"must divide the per-rank mini-batch of {rows // dp} rollouts ({prefix}.ppo_mini_batch_size "
                 f"x rollout.n / {ranks})")
    for role in ROLES:
        size = role_sharding(cfg, role).fsdp_size
        if size > 0 and dp % size:
            fail(f"{SHARDING_KEYS[role]}.fsdp_size", size,
                 f"must divide the {ranks}" if tp > 1 else f"must divide the world size {world}")
