"""The callback's settings: klguard's dotted keys, checked as `klguard train` checks them, and the trainer's
own settings the guard depends on. Every problem is one line (ConfigError) naming the key."""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from dataclasses import dataclass

from klguard.config import ConfigError
from klguard.config.restricted import load_restricted, with_host_defaults
from klguard.config.schema import KLCtrlConfig, TRLConfig
from klguard.guard import GuardConfig
from klguard.guard.config import EXTERNAL_HOST_DEFAULTS

KEY_PREFIXES = ("guard.", "algorithm.kl_ctrl.", "trl.")
"""The keys a TRL run takes from klguard; TRL's own training settings stay in GRPOConfig."""

REFUSED = {
    "algorithm.kl_ctrl.kl_coef": "the controller starts from GRPOConfig's beta: set beta there",
    "algorithm.kl_ctrl.kl_unit": "TRL logs the KL as a token mean only: the controller uses token_mean",
}


@dataclass(frozen=True)
class CallbackSettings:
    guard: GuardConfig
    kl_ctrl: KLCtrlConfig
    trl: TRLConfig


def load_settings(overrides: Sequence[str]) -> CallbackSettings:
    """Parse ``overrides`` (``"key=value"`` strings, klguard's keys) into the callback's settings."""
    overrides = with_host_defaults(overrides, EXTERNAL_HOST_DEFAULTS)  # another trainer's model: not the built-in's
    config = load_restricted(overrides, KEY_PREFIXES, who="the TRL callback", refused=REFUSED,
                             elsewhere="set TRL's training settings in GRPOConfig")
    return CallbackSettings(config.guard, config.algorithm.kl_ctrl, config.trl)


def check_trainer(trainer, settings: CallbackSettings) -> None:
    """The trainer settings the guard needs; ConfigError naming the setting otherwise."""
    args = trainer.args
    if not getattr(trainer, "beta", 0.0):
        raise ConfigError("GRPOConfig beta is 0: TRL then loads no reference model and the guard cannot steer the KL; "
                          "set beta > 0 (e.g. beta=0.001)")
    if args.logging_steps != 1:
        raise ConfigError(f"GRPOConfig logging_steps is {args.logging_steps}: the guard decides on each step's "
                          "metrics; set logging_steps=1")
    if getattr(args, "restore_callback_states_from_checkpoint", False):
        raise ConfigError("TrainingArguments restore_callback_states_from_checkpoint must be False: KLGuardCallback "
                          "restores its own state on resume_from_checkpoint")
    gold = settings.trl.gold_reward
    names = list(getattr(trainer, "reward_func_names", []))
    if gold is not None and gold not in names:
        raise ConfigError(f"trl.gold_reward={gold!r} is not a reward function of this trainer (they are: "
                          f"{', '.join(names) or 'none'})")
    if gold is not None and float(trainer.reward_weights[names.index(gold)]) != 0.0:
        warnings.warn(f"klguard: trl.gold_reward {gold!r} has a non-zero reward weight: the policy is trained on it, "
                      "so it is no independent gold score", stacklevel=3)
    sharded = getattr(trainer, "is_deepspeed_enabled", False) or getattr(trainer, "is_fsdp_enabled", False)
    if sharded and settings.guard.enable and settings.guard.max_rollbacks > 0:
        raise ConfigError("guard.max_rollbacks > 0 needs an unsharded model (one process or DDP): the callback's "
                          "rollback is not written for DeepSpeed or FSDP; set guard.max_rollbacks=0 (a trigger then "
                          "pauses)")
