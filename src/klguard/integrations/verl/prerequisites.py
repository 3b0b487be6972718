"""What a verl run's settings keep the guard from doing, one line each with the verl key to add.

A pure function of verl's config (an OmegaConf DictConfig or a plain dict, verl's defaults for absent keys), so the
plugin says it at start (klguard.integrations.verl.trainer) and tests read it without GPUs. The rules named are the
guard's (klguard.guard.rules): kl_hard, kl_spike and kl_slow read the KL to the reference, which verl logs only
with a KL use on (`actor/reward_kl_penalty` in the reward, `actor/kl_loss` as a loss); val_drop and the
proxy_val_divergence hacking signal read `val-core/*`, which verl logs only when it validates.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

# verl 0.9.1's defaults (verl/trainer/config/ppo_trainer.yaml, actor/actor.yaml)
VERL_DEFAULTS = {"trainer.save_freq": -1, "trainer.test_freq": -1, "algorithm.use_kl_in_reward": False,
                 "actor_rollout_ref.actor.use_kl_loss": False, "klguard.guard.enable": True}


def setting(config: Mapping, key: str) -> Any:
    """The value of a dotted key, verl's default where the config lacks it."""
    node: Any = config
    for part in key.split("."):
        if not isinstance(node, Mapping) or part not in node:
            return VERL_DEFAULTS.get(key)
        node = node[part]
    return VERL_DEFAULTS.get(key) if node is None else node


def _on(value: Any) -> bool:
    return value is True or (isinstance(value, str) and value.strip().lower() in ("true", "1"))


def _number(value: Any) -> float:
    try:
        return float(value)
    except (TypeError, ValueError):
        return -1.0


def missing_prerequisites(config: Mapping) -> list[str]:
    """One line for each thing the guard cannot do with these settings, naming the verl key to set and its value."""
    if not _on(setting(config, "klguard.guard.enable")):
        return []
    lines = []
    save_freq = setting(config, "trainer.save_freq")
    if _number(save_freq) <= 0:
        lines.append(f"klguard: trainer.save_freq={save_freq} writes no checkpoint, so every rollback becomes a "
                     "pause; add trainer.save_freq=10 (any N > 0) to roll back instead")
    if not _on(setting(config, "algorithm.use_kl_in_reward")) and \
            not _on(setting(config, "actor_rollout_ref.actor.use_kl_loss")):
        lines.append("klguard: verl logs no KL to the reference (algorithm.use_kl_in_reward=False, "
                     "actor_rollout_ref.actor.use_kl_loss=False), so kl_hard, kl_spike and kl_slow get no input and "
                     "raising the KL coefficient does nothing; add algorithm.use_kl_in_reward=True (or "
                     "actor_rollout_ref.actor.use_kl_loss=True)")
    test_freq = setting(config, "trainer.test_freq")
    if _number(test_freq) <= 0:
        lines.append(f"klguard: trainer.test_freq={test_freq} runs no validation during training, so the rule "
                     "val_drop and the proxy_val_divergence hacking signal get no input; add trainer.test_freq=10 "
                     "(any N > 0)")
    return lines
