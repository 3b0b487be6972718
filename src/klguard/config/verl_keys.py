"""verl's configuration keys, two releases of them, and the keys verl 0.9.1 renamed.

`resources/verl_keys.txt` is the snapshot klguard was built on, `resources/verl_0.9.1_keys.txt` verl 0.9.1's
generated PPO config (both: `key = default`, one per line). A key of either that klguard does not implement is
accepted and listed in the one "not applicable" warning.

verl 0.9.1 moved the reward settings under `reward.` and the critic's engine settings to `critic.fsdp.`; klguard
takes both spellings with one meaning and keeps the older one (its schema's) as the name. 0.9.1 still lists the
older keys with the value null, meaning "not set": a null there is dropped, so that a whole 0.9.1 config file loads.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from functools import cache
from importlib import resources
from typing import Any

from klguard.errors import ConfigError

KEY_FILES = ("verl_keys.txt", "verl_0.9.1_keys.txt")

# verl 0.9.1's spelling -> klguard's (verl's older) spelling of the same setting
RENAMED = {
    "reward.reward_model.enable": "reward_model.enable",
    "reward.reward_model.model_path": "reward_model.model.path",
    "reward.custom_reward_function.path": "custom_reward_function.path",
    "reward.custom_reward_function.name": "custom_reward_function.name",
    "reward.custom_reward_function.reward_kwargs": "custom_reward_function.reward_kwargs",  # and the keys under it
    "critic.fsdp": "critic.model.fsdp_config",  # the critic's engine settings, every key under it
}
# Spellings outside both key files, taken with the same meaning: the reward manager's kwargs under 0.9.1's `reward.`
# (DAPO's overlong_buffer_cfg, max_resp_len), and the schedule's name in verl's Megatron optimizer config, which
# FSDP lines in verl's examples also give
OTHER_SPELLINGS = {
    "reward.reward_kwargs": "reward_model.reward_kwargs",
    "actor_rollout_ref.actor.optim.lr_decay_style": "actor_rollout_ref.actor.optim.lr_scheduler_type",
    "critic.optim.lr_decay_style": "critic.optim.lr_scheduler_type",
    # SAPO's gate temperatures where verl's SAPO README and example lines put them (`+...policy_loss.tau_pos`); verl
    # reads them from actor.tau_pos/tau_neg, and its PolicyLossConfig has no such field, so verl 0.9 itself stops at
    # this spelling when it builds the actor's config: klguard takes it as actor.tau_pos/tau_neg, the README's meaning
    "actor_rollout_ref.actor.policy_loss.tau_pos": "actor_rollout_ref.actor.tau_pos",
    "actor_rollout_ref.actor.policy_loss.tau_neg": "actor_rollout_ref.actor.tau_neg",
}
# verl's free-form maps: verl hands them on whole (`ray_kwargs.ray_init` becomes ray.init's keyword arguments, its
# runtime_env Ray's, env_vars a map of names), so any key under them is accepted, as Hydra's `+` and verl accept it;
# klguard runs no Ray: they are listed in the "not applicable" warning
FREE_FORM_MAPS = ("ray_kwargs.ray_init",)
# Spellings of FSDP settings on verl main, by the end of the key: the compute dtype is klguard's fsdp_config.dtype
# (autocast, weights and gradient reduction in fp32); the other parts are engine details klguard does not apply
# (listed in the "not applicable" warning).
_DTYPE_SUFFIXES = (".fsdp_config.mixed_precision.param_dtype", ".fsdp_config.fsdp_plan.param_dtype")
_DTYPE_ROLES = ("actor_rollout_ref.actor", "critic.model")  # the roles with a compute dtype
_LOAD_DTYPE_KEYS = ("actor_rollout_ref.model.torch_dtype", "critic.model.torch_dtype")
_ENGINE_DETAIL_PARTS = (".fsdp_config.mixed_precision.", ".fsdp_config.fsdp_plan.")
_LEGACY_SECTIONS = ("reward_model.", "custom_reward_function.")


def _read(name: str) -> dict[str, str]:
    text = resources.files("klguard").joinpath(f"resources/{name}").read_text()
    pairs = (line.split(" = ", 1) for line in text.splitlines() if not line.startswith("#") and " = " in line)
    return {key.strip(): default for key, default in pairs}


@cache
def verl_keys() -> frozenset[str]:
    """Every key of either release, and under klguard's name where 0.9.1 renamed it."""
    keys = {key for name in KEY_FILES for key in _read(name)}
    return frozenset(keys | {_rename(key) for key in keys})


@cache
def _null_in_0_9_1() -> frozenset[str]:
    """The older reward keys that verl 0.9.1 keeps with the default null (not set)."""
    keys = _read("verl_0.9.1_keys.txt").items()
    return frozenset(k for k, v in keys if k.startswith(_LEGACY_SECTIONS) and v == "None")


def in_free_form_map(key: str) -> bool:
    """A key under one of verl's free-form maps (FREE_FORM_MAPS)."""
    return any(key.startswith(name + ".") for name in FREE_FORM_MAPS)


def newer_engine_detail(key: str) -> bool:
    """A newer FSDP engine key that klguard accepts and does not apply (mixed_precision.reduce_dtype, fsdp_plan.*, the
    dtype the weights load in: klguard keeps them in fp32 and computes in fsdp_config.dtype)."""
    return any(part in key for part in _ENGINE_DETAIL_PARTS) or key in _LOAD_DTYPE_KEYS


def _rename(key: str) -> str:
    for new, old in (RENAMED | OTHER_SPELLINGS).items():
        if key == new or key.startswith(new + "."):
            key = old + key[len(new):]
            break
    for suffix in _DTYPE_SUFFIXES:
        if key.endswith(suffix) and key.removesuffix(suffix) in _DTYPE_ROLES:
            return key.removesuffix(suffix) + ".fsdp_config.dtype"
    return key


def canonical(pairs: Iterable[tuple[str, Any]]) -> Iterator[tuple[str, Any]]:
    """One layer's (key, value) pairs under klguard's names; two spellings of one key with two values are an error."""
    seen: dict[str, tuple[str, Any]] = {}
    for key, value in pairs:
        name = _rename(key)
        if value is None and (name != key or key in _null_in_0_9_1()):
            continue
        if name in seen and seen[name][0] != key and seen[name][1] != value:
            first, first_value = seen[name]
            raise ConfigError(f"{key}={value!r} and {first}={first_value!r} are one setting (verl 0.9.1's and the "
                              "older spelling): give it once")
        seen[name] = (key, value)
        yield name, value
