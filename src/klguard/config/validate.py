"""Checks of values and combinations, run before any model loads. Each failure names the key."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from klguard.algo.advantage import ADV_ESTIMATORS, GROUP_ESTIMATORS
from klguard.algo.kl import KL_ESTIMATORS
from klguard.algo.loss import LOSS_AGG_MODES
from klguard.config.schema import Config
from klguard.errors import ConfigError
from klguard.runtime.profiling import CONTENTS as PROFILER_CONTENTS

KL_CTRL_TYPES = ("fixed", "adaptive", "pid")
STRATEGIES = ("fsdp2", "fsdp", "none")
ROLLOUT_NAMES = ("hf", "vllm", "sglang")
DTYPES = ("auto", "bfloat16", "bf16", "float32", "fp32")
LOGGERS = ("console", "jsonl", "file", "tensorboard", "wandb", "mlflow")


def _fail(key: str, value: Any, why: str) -> None:
    raise ConfigError(f"{key}={value!r} {why}")


def _positive(key: str, value: float, *, allow_zero: bool = False) -> None:
    if value is None or not math.isfinite(value) or value < 0 or (value == 0 and not allow_zero):
        _fail(key, value, "must be " + ("a finite number >= 0" if allow_zero else "a finite number > 0"))


def _one_of(key: str, value: Any, choices: tuple | list | set | dict) -> None:
    if value not in choices:
        _fail(key, value, f"is not one of: {', '.join(sorted(map(str, choices)))}")


def validate(cfg: Config) -> None:
    """Raise ConfigError for the first invalid value or inconsistent combination."""
    _validate_algorithm(cfg)
    _validate_actor(cfg)
    _validate_rollout(cfg)
    _validate_batches(cfg)
    _validate_data(cfg)
    _validate_trainer(cfg)
    _validate_user_files(cfg)
    _validate_reward_model(cfg)
    _validate_calibrate(cfg)
    _validate_profiler(cfg)
    try:
        cfg.guard.validate()
    except ValueError as exc:
        raise ConfigError(str(exc)) from None


def _validate_algorithm(cfg: Config) -> None:
    alg, ctrl = cfg.algorithm, cfg.algorithm.kl_ctrl
    _one_of("algorithm.kl_ctrl.type", ctrl.type, KL_CTRL_TYPES)
    _positive("algorithm.kl_ctrl.kl_coef", ctrl.kl_coef, allow_zero=True)
    _positive("algorithm.kl_ctrl.target_kl", ctrl.target_kl)
    if ctrl.horizon <= 0:
        _fail("algorithm.kl_ctrl.horizon", ctrl.horizon, "must be > 0")
    if ctrl.type in ("adaptive", "pid") and ctrl.kl_coef == 0:
        _fail("algorithm.kl_ctrl.kl_coef", 0.0, f"must be > 0 with a {ctrl.type} controller (it scales the value)")
    _one_of("algorithm.kl_ctrl.kl_unit", ctrl.kl_unit, ("token_mean", "seq_sum"))
    for gain in ("kp", "ki", "kd"):
        _positive(f"algorithm.kl_ctrl.{gain}", getattr(ctrl, gain), allow_zero=True)
    for key, est in (("algorithm.kl_penalty", alg.kl_penalty),
                     ("actor_rollout_ref.actor.kl_loss_type", cfg.actor_rollout_ref.actor.kl_loss_type)):
        _one_of(key, est, KL_ESTIMATORS)
        if est == "full":
            _fail(key, est, "needs full logits, which this trainer does not keep; use low_var_kl or kl")
    _one_of("algorithm.adv_estimator", alg.adv_estimator, ADV_ESTIMATORS)
    if not 0 <= alg.gamma <= 1:
        _fail("algorithm.gamma", alg.gamma, "must be in [0, 1]")
    if not 0 <= alg.lam <= 1:
        _fail("algorithm.lam", alg.lam, "must be in [0, 1]")
    n = cfg.actor_rollout_ref.rollout.n
    if alg.adv_estimator in GROUP_ESTIMATORS and n < 2:
        _fail("actor_rollout_ref.rollout.n", n, f"must be >= 2 for the group estimator {alg.adv_estimator}")
    if cfg.critic.enable is False and alg.adv_estimator == "gae":
        _fail("critic.enable", False, "but algorithm.adv_estimator=gae needs a critic")


def _validate_actor(cfg: Config) -> None:
    actor = cfg.actor_rollout_ref.actor
    prefix = "actor_rollout_ref.actor"
    _one_of(f"{prefix}.strategy", actor.strategy, STRATEGIES)
    _one_of("critic.strategy", cfg.critic.strategy, STRATEGIES)
    for name in ("clip_ratio", "clip_ratio_low", "clip_ratio_high"):
        value = getattr(actor, name)
        if value is not None and not 0 < value < 1:
            _fail(f"{prefix}.{name}", value, "must be in (0, 1)")
    if not actor.clip_ratio_c > 1:
        _fail(f"{prefix}.clip_ratio_c", actor.clip_ratio_c, "must be > 1 (the dual-clip bound is c * |A|)")
    _one_of(f"{prefix}.loss_agg_mode", actor.loss_agg_mode, LOSS_AGG_MODES)
    _one_of("critic.loss_agg_mode", cfg.critic.loss_agg_mode, LOSS_AGG_MODES)
    _positive(f"{prefix}.entropy_coeff", actor.entropy_coeff, allow_zero=True)
    _positive(f"{prefix}.kl_loss_coef", actor.kl_loss_coef, allow_zero=True)
    _positive("critic.cliprange_value", cfg.critic.cliprange_value)
    for key, optim in ((f"{prefix}.optim", actor.optim), ("critic.optim", cfg.critic.optim)):
        _positive(f"{key}.lr", optim.lr)
        _positive(f"{key}.weight_decay", optim.weight_decay, allow_zero=True)
        _one_of(f"{key}.lr_scheduler_type", optim.lr_scheduler_type, ("constant", "cosine"))
        if not 0 <= optim.lr_warmup_steps_ratio < 1:
            _fail(f"{key}.lr_warmup_steps_ratio", optim.lr_warmup_steps_ratio, "must be in [0, 1)")
        if len(optim.betas) != 2 or not all(0 <= b < 1 for b in optim.betas):
            _fail(f"{key}.betas", optim.betas, "must be two numbers in [0, 1)")
    for key, sharding in _sharding_sections(cfg):
        if sharding.fsdp_size == 0 or sharding.fsdp_size < -1:
            _fail(f"{key}.fsdp_size", sharding.fsdp_size, "must be -1 (all ranks) or >= 1")
    for key, epochs in ((f"{prefix}.ppo_epochs", actor.ppo_epochs), ("critic.ppo_epochs", cfg.critic.ppo_epochs)):
        if epochs < 1:
            _fail(key, epochs, "must be >= 1")


def _validate_rollout(cfg: Config) -> None:
    rollout = cfg.actor_rollout_ref.rollout
    prefix = "actor_rollout_ref.rollout"
    _one_of(f"{prefix}.name", rollout.name, ROLLOUT_NAMES)  # vllm/sglang: accepted, sampled with hf (one warning)
    if rollout.n < 1:
        _fail(f"{prefix}.n", rollout.n, "must be >= 1")
    for key, kw in ((prefix, rollout), (f"{prefix}.val_kwargs", rollout.val_kwargs)):
        if kw.do_sample and not (math.isfinite(kw.temperature) and kw.temperature > 0):
            _fail(f"{key}.temperature", kw.temperature, "must be > 0 when do_sample is true")
        if not 0 < kw.top_p <= 1:
            _fail(f"{key}.top_p", kw.top_p, "must be in (0, 1]")
        if kw.top_k < -1:
            _fail(f"{key}.top_k", kw.top_k, "must be -1 (off) or >= 0")


def _validate_batches(cfg: Config) -> None:
    """verl's batch arithmetic; a mismatch here is verl #2505's silent grad_norm=NaN."""
    n = cfg.actor_rollout_ref.rollout.n
    train = cfg.data.train_batch_size
    if train < 1:
        _fail("data.train_batch_size", train, "must be >= 1")
    for prefix, section in (("actor_rollout_ref.actor", cfg.actor_rollout_ref.actor), ("critic", cfg.critic)):
        mini = section.ppo_mini_batch_size
        if mini < 1:
            _fail(f"{prefix}.ppo_mini_batch_size", mini, "must be >= 1")
        if train % mini:
            _fail(f"{prefix}.ppo_mini_batch_size", mini, f"must divide data.train_batch_size={train}")
        micro = section.ppo_micro_batch_size_per_gpu
        if micro is None:
            continue
        if micro < 1:
            _fail(f"{prefix}.ppo_micro_batch_size_per_gpu", micro, "must be >= 1")
        if micro > mini * n:
            _fail(f"{prefix}.ppo_micro_batch_size_per_gpu", micro,
                  f"is larger than the mini-batch ({prefix}.ppo_mini_batch_size={mini} x rollout.n={n})")
        if (mini * n) % micro:
            _fail(f"{prefix}.ppo_micro_batch_size_per_gpu", micro,
                  f"must divide the mini-batch of {mini * n} rollouts (ppo_mini_batch_size x rollout.n)")
    for key, value in (
        ("actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu",
         cfg.actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu),
        ("actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu",
         cfg.actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu),
    ):
        if value is not None and value < 1:
            _fail(key, value, "must be >= 1")


def _sharding_sections(cfg: Config) -> tuple[tuple[str, Any], ...]:
    return (("actor_rollout_ref.actor.fsdp_config", cfg.actor_rollout_ref.actor.fsdp_config),
            ("actor_rollout_ref.ref.fsdp_config", cfg.actor_rollout_ref.ref.fsdp_config),
            ("critic.model.fsdp_config", cfg.critic.model.fsdp_config))


def validate_world(cfg: Config, world: int) -> None:
    """Checks that need the number of ranks (torchrun's WORLD_SIZE), run when training starts: every
    mini-batch splits evenly over the data-parallel ranks and the per-rank micro-batch divides its share."""
    n = cfg.actor_rollout_ref.rollout.n
    for prefix, section in (("actor_rollout_ref.actor", cfg.actor_rollout_ref.actor), ("critic", cfg.critic)):
        rows = section.ppo_mini_batch_size * n
        if rows % world:
            _fail(f"{prefix}.ppo_mini_batch_size", section.ppo_mini_batch_size,
                  f"x rollout.n={n} = {rows} rollouts does not split evenly over {world} ranks (WORLD_SIZE)")
        micro = section.ppo_micro_batch_size_per_gpu
        if micro is not None and (rows // world) % micro:
            _fail(f"{prefix}.ppo_micro_batch_size_per_gpu", micro,
                  f"must divide the per-rank mini-batch of {rows // world} rollouts ({prefix}.ppo_mini_batch_size "
                  f"x rollout.n / {world} ranks)")
    for key, sharding in _sharding_sections(cfg):
        if sharding.fsdp_size > 0 and world % sharding.fsdp_size:
            _fail(f"{key}.fsdp_size", sharding.fsdp_size, f"must divide the world size {world}")


def _validate_data(cfg: Config) -> None:
    data = cfg.data
    for key in ("max_prompt_length", "max_response_length", "builtin_train_size", "builtin_val_size"):
        if getattr(data, key) < 1:
            _fail(f"data.{key}", getattr(data, key), "must be >= 1")
    _one_of("data.builtin_form", data.builtin_form, ("a+b-c", "mixed", "two"))
    _one_of("data.truncation", data.truncation, ("error", "left", "right", "middle"))
    for key in ("train_files", "val_files"):
        value = getattr(data, key)
        files = [value] if isinstance(value, str) else value
        if value is not None and (not isinstance(files, list) or not all(isinstance(f, str) for f in files)):
            _fail(f"data.{key}", value, "must be a path or a list of paths")
    if (data.train_files is None) != (data.val_files is None):
        _fail("data.val_files" if data.val_files is None else "data.train_files", None,
              "must be set together with the other (null for both = the built-in task)")


def _validate_trainer(cfg: Config) -> None:
    tr = cfg.trainer
    if tr.total_epochs < 1:
        _fail("trainer.total_epochs", tr.total_epochs, "must be >= 1")
    if tr.total_training_steps is not None and tr.total_training_steps < 1:
        _fail("trainer.total_training_steps", tr.total_training_steps, "must be >= 1 or null")
    for name in tr.logger:
        _one_of("trainer.logger", name, LOGGERS)
    _one_of("trainer.resume_mode", tr.resume_mode, ("auto", "disable", "resume_path"))
    if tr.resume_mode == "resume_path" and not tr.resume_from_path:
        _fail("trainer.resume_from_path", None, "must be set when trainer.resume_mode=resume_path")
    _one_of("trainer.device", tr.device, ("auto", "cpu", "cuda"))
    if tr.save_freq == 0 or tr.save_freq < -1:
        _fail("trainer.save_freq", tr.save_freq, "must be >= 1 or -1")
    if tr.test_freq == 0 or tr.test_freq < -1:
        _fail("trainer.test_freq", tr.test_freq, "must be >= 1 or -1")
    if tr.max_actor_ckpt_to_keep is not None and tr.max_actor_ckpt_to_keep < 1:
        _fail("trainer.max_actor_ckpt_to_keep", tr.max_actor_ckpt_to_keep, "must be >= 1 or null")
    _positive("trainer.dist_timeout_s", tr.dist_timeout_s)
    if tr.max_nonfinite_steps < 0:
        _fail("trainer.max_nonfinite_steps", tr.max_nonfinite_steps, "must be >= 0 (0 = never pause)")


def _validate_reward_model(cfg: Config) -> None:
    rm = cfg.reward_model
    _one_of("actor_rollout_ref.actor.fsdp_config.dtype", cfg.actor_rollout_ref.actor.fsdp_config.dtype, DTYPES)
    _one_of("critic.model.fsdp_config.dtype", cfg.critic.model.fsdp_config.dtype, DTYPES)
    for key in ("micro_batch_size_per_gpu", "max_length"):
        value = getattr(rm, key)
        if value is not None and value < 1:
            _fail(f"reward_model.{key}", value, "must be >= 1 or null")
    _positive("reward_model.length_penalty", rm.length_penalty, allow_zero=True)
    if not math.isfinite(rm.rule_weight):
        _fail("reward_model.rule_weight", rm.rule_weight, "must be a finite number")
    if not rm.enable:
        return
    if not rm.model.path:
        _fail("reward_model.model.path", None, "must be set when reward_model.enable=true")
    if cfg.proxy_reward.enable:
        _fail("proxy_reward.enable", True, "conflicts with reward_model.enable=true (both would set the score)")


def _validate_calibrate(cfg: Config) -> None:
    cal = cfg.calibrate
    if not cal.grid:
        _fail("calibrate.grid", cal.grid, "must list at least one target_kl")
    for value in cal.grid:
        _positive("calibrate.grid", value)
    _one_of("calibrate.controller", cal.controller, ("adaptive", "pid"))
    _positive("calibrate.horizon", cal.horizon)
    _positive("calibrate.kl_coef", cal.kl_coef)
    if not 0 <= cal.max_hacking_rate <= 1:
        _fail("calibrate.max_hacking_rate", cal.max_hacking_rate, "must be in [0, 1]")
    if cal.parallel is not None and cal.parallel < 1:
        _fail("calibrate.parallel", cal.parallel, "must be >= 1 or null")


def _validate_profiler(cfg: Config) -> None:
    prof, role = cfg.global_profiler, cfg.actor_rollout_ref.actor.profiler
    if prof.tool not in (None, "torch"):
        _fail("global_profiler.tool", prof.tool, "is not supported: klguard writes torch.profiler traces (tool=torch) "
              "or none (null)")
    if prof.steps is not None and not (isinstance(prof.steps, list) and all(_whole(s, 1) for s in prof.steps)):
        _fail("global_profiler.steps", prof.steps, "must be a list of training steps >= 1, or null")
    if prof.tool == "torch" and not prof.steps:
        _fail("global_profiler.steps", prof.steps, "must list the steps to profile when global_profiler.tool=torch")
    if not all(_whole(r, 0) for r in role.ranks):
        _fail("actor_rollout_ref.actor.profiler.ranks", role.ranks, "must be a list of ranks >= 0")
    for item in role.tool_config.torch.contents:
        _one_of("actor_rollout_ref.actor.profiler.tool_config.torch.contents", item, PROFILER_CONTENTS)


def _whole(value: Any, least: int) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= least


def _validate_user_files(cfg: Config) -> None:
    """Files the run reads late (after the warm start): fail now, not minutes in."""
    path = cfg.custom_reward_function.path
    if path and not Path(path).expanduser().is_file():
        raise ConfigError(f"custom_reward_function.path={path} does not exist")
