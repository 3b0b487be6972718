"""Building blocks of a run: model paths, datasets, models (sharded under torchrun), optimizers and schedules.

Where the config names the built-in task, its parts come from the `task` argument (klguard.ppo.task)."""

from __future__ import annotations

import math
from pathlib import Path

import torch

from klguard.algo.kl import build_kl_controller
from klguard.config.roles import (
    built_roles,
    initial_kl_coef,
    role_tp,
    run_tp,
    strategy,
    tp_key,
    uses_critic,
    uses_reference,
)
from klguard.config.roles import sharding as role_sharding
from klguard.config.schema import BUILTIN_MODEL, Config, OptimConfig
from klguard.data.dataset import load_rl_dataset
from klguard.data.sampler import PromptSampler
from klguard.distributed.context import DistContext
from klguard.distributed.fsdp import shard_model
from klguard.distributed.sharded_checkpoint import is_dcp
from klguard.distributed.tensor_parallel import check_tensor_parallel
from klguard.model.loading import check_model_folder, compute_dtype, hf_config, load_critic, load_policy
from klguard.model.lora import lora_settings
from klguard.ppo.checkpointing import REFERENCE_DIR
from klguard.ppo.generation_weights import GenerationWeights
from klguard.ppo.state import TrainState
from klguard.ppo.task import BuiltinTask, require_task
from klguard.reward.manager import RewardManager, proxy_enabled
from klguard.reward.rm_outliers import RMFeatureOutliers


def resolve_model_path(cfg: Config, task: BuiltinTask | None, *, log=print) -> Path:
    """The policy folder: the built-in task's SFT policy, or a checked local folder."""
    path = cfg.actor_rollout_ref.model.path
    if path == BUILTIN_MODEL:
        return require_task(task, f"actor_rollout_ref.model.path={path}").policy_path(cfg, log=log)
    return check_model_folder(path, "actor_rollout_ref.model.path")


def resolve_tokenizer_path(cfg: Config, task: BuiltinTask | None) -> Path:
    """The tokenizer folder; for the built-in policy a saved copy that needs no SFT run first."""
    model_cfg = cfg.actor_rollout_ref.model
    if model_cfg.tokenizer_path:
        return check_model_folder(model_cfg.tokenizer_path, "actor_rollout_ref.model.tokenizer_path", tokenizer=True)
    if model_cfg.path == BUILTIN_MODEL:
        return require_task(task, f"actor_rollout_ref.model.path={model_cfg.path}").tokenizer_path(cfg)
    return check_model_folder(model_cfg.path, "actor_rollout_ref.model.path")


def build_datasets(config: Config, tokenizer, run_dir: Path, task: BuiltinTask | None, *,
                   write_builtin: bool = True):
    """Train and validation datasets; `write_builtin=False` reads the built-in task's files another rank wrote."""
    data = config.data
    train_files, val_files = data.train_files, data.val_files
    if train_files is None and not write_builtin:
        train_files, val_files = str(run_dir / "data" / "train.parquet"), str(run_dir / "data" / "val.parquet")
    elif train_files is None:  # the built-in task, written as verl-format parquet
        task = require_task(task, "data.train_files=null")
        train_files, val_files = (str(p) for p in task.write_data(config, run_dir / "data"))
    kwargs = dict(prompt_key=data.prompt_key, max_prompt_length=data.max_prompt_length,
                  filter_overlong_prompts=data.filter_overlong_prompts, truncation=data.truncation,
                  apply_chat_template_kwargs=data.apply_chat_template_kwargs)
    train = load_rl_dataset(train_files, tokenizer, max_samples=data.train_max_samples, **kwargs)
    val = load_rl_dataset(val_files, tokenizer, max_samples=data.val_max_samples, **kwargs)
    return train, val


def build_optimizer(model: torch.nn.Module, cfg: OptimConfig, total_steps: int):
    """AdamW and a per-step schedule: linear warm-up, then constant or cosine (verl's options)."""
    params = [p for p in model.parameters() if p.requires_grad]
    optim = torch.optim.AdamW(params, lr=cfg.lr, betas=tuple(cfg.betas), weight_decay=cfg.weight_decay)
    warmup = cfg.lr_warmup_steps if cfg.lr_warmup_steps > 0 else int(cfg.lr_warmup_steps_ratio * total_steps)

    def factor(step: int) -> float:
        if step < warmup:
            return (step + 1) / warmup
        if cfg.lr_scheduler_type == "constant":
            return 1.0
        progress = (step - warmup) / max(1, total_steps - warmup)
        cosine = 0.5 * (1.0 + math.cos(math.pi * 2.0 * cfg.num_cycles * progress))
        return cfg.min_lr_ratio + (1.0 - cfg.min_lr_ratio) * max(0.0, cosine)

    return optim, torch.optim.lr_scheduler.LambdaLR(optim, factor)


def _shard(model: torch.nn.Module, cfg: Config, ctx: DistContext, role: str) -> torch.nn.Module:
    """Tensor parallelism and FSDP2 for `role` (actor | critic | ref) as configured; the reference follows the
    actor's strategy and precision."""
    arr = cfg.actor_rollout_ref
    role_strategy, sharding = strategy(cfg, role), role_sharding(cfg, role)
    dtype = cfg.critic.model.fsdp_config.dtype if role == "critic" else arr.actor.fsdp_config.dtype
    if role == "ref" and role_strategy == "none":
        return model  # frozen: a whole copy on every rank needs no gradient averaging
    return shard_model(model, ctx, strategy=role_strategy, fsdp_size=sharding.fsdp_size,
                       offload=sharding.offload_policy, reshard_after_forward=sharding.reshard_after_forward,
                       param_dtype=compute_dtype(dtype, ctx.device), tp=role_tp(cfg, role), tp_key=tp_key(role))



def load_models(cfg: Config, ctx: DistContext, policy_path: Path, resume_from: Path | None
                ) -> tuple[torch.nn.Module, torch.nn.Module | None, torch.nn.Module | None]:
    """(actor, reference, critic) from the policy or an HF-layout checkpoint, sharded under torchrun. A sharded
    (DCP) checkpoint's weights are loaded later, into the sharded models (Checkpoints.restore)."""
    device = ctx.device

    def hf_folder(name: str) -> Path | None:
        folder = resume_from / name if resume_from is not None else None
        return folder if folder is not None and folder.is_dir() and not is_dcp(folder) else None

    actor = _shard(load_policy(hf_folder("actor") or policy_path, cfg, trainable=True, device=device), cfg, ctx,
                   "actor")
    ref = critic = None
    if uses_reference(cfg) and not reference_in_actor(cfg, resume_from):
        ref = build_reference(cfg, ctx, hf_folder(REFERENCE_DIR) or policy_path)
    if uses_critic(cfg):
        critic = load_critic(policy_path, cfg, device=device, resume_path=hf_folder("critic"))
        critic = _shard(critic, cfg, ctx, "critic")
    return actor, ref, critic


def build_reference(cfg: Config, ctx: DistContext, path: Path) -> torch.nn.Module:
    """A frozen reference policy of its own from `path`, sharded as the ref role."""
    return _shard(load_policy(path, cfg, trainable=False, device=ctx.device), cfg, ctx, "ref")


def reference_in_actor(cfg: Config, resume_from: Path | None) -> bool:
    """With LoRA the reference is the actor with its adapters off (its base weights are the initial policy and
    never train), as in verl and TRL: no second copy of the model. Not when the checkpoint resumed holds a reference
    of its own (a rollback re-anchored it)."""
    saved = resume_from is not None and (resume_from / REFERENCE_DIR).is_dir()
    return lora_settings(cfg.actor_rollout_ref.model) is not None and not saved


def resolve_learned_rm(cfg: Config, task: BuiltinTask | None, policy_path: Path | None = None, *,
                       log=print) -> Path | None:
    """The built-in learned RM's folder when it is the proxy (proxy_reward.kind=learned_rm): fit to the samples of
    `policy_path` (default: the run's SFT policy) now unless cached; None otherwise."""
    if cfg.proxy_reward.kind != "learned_rm" or not proxy_enabled(cfg):
        return None
    task = require_task(task, "proxy_reward.kind=learned_rm")
    return task.learned_rm(cfg, policy_path or resolve_model_path(cfg, task, log=log), log=log)


def build_rewards(cfg: Config, tokenizer, task: BuiltinTask | None, learned_rm: Path | None, *,
                  device: torch.device | None = None) -> RewardManager:
    """The run's reward manager, with the built-in task's scoring when there is a task to score with."""
    task_reward = task.reward(cfg) if task is not None else None
    return RewardManager(cfg, tokenizer, device=device, learned_rm=learned_rm, task_reward=task_reward)


def check_split(cfg: Config) -> None:
    """Before any rendezvous: every model a tensor-parallel run splits can be split (its HF config read from its
    folder; the built-in policy, not trained yet, is checked when it is sharded)."""
    arr, own_critic = cfg.actor_rollout_ref, cfg.critic.model.path is not None
    for role in built_roles(cfg):
        model = cfg.critic.model if role == "critic" and own_critic else arr.model
        key = "critic.model.path" if model is cfg.critic.model else "actor_rollout_ref.model.path"
        if role_tp(cfg, role) > 1 and model.path != BUILTIN_MODEL:
            folder = check_model_folder(model.path, key)
            trust = arr.model.trust_remote_code
            check_tensor_parallel(hf_config(folder, model.override_config, trust, key), role_tp(cfg, role),
                                  tp_key(role))


def generation_weights(cfg: Config, actor: torch.nn.Module, policy_path: Path,
                       device: torch.device) -> GenerationWeights:
    """What the rollout generates with: the actor, or under tensor parallelism with
    rollout.tensor_model_parallel_size=1 a whole frozen replica of it on each rank."""
    arr = cfg.actor_rollout_ref
    replica = None
    if run_tp(cfg) > 1 and arr.rollout.tensor_model_parallel_size == 1:
        replica = lambda: load_policy(policy_path, cfg, trainable=False, device=device)  # noqa: E731
    return GenerationWeights(actor, arr.actor.fsdp_config.reshard_after_forward, replica)


def build_train_state(cfg: Config, ctx: DistContext, policy_path: Path, resume_from: Path | None,
                      sampler: PromptSampler, total_steps: int, *, rm_features: bool = False) -> TrainState:
    """The run's models, optimizers, schedules and KL controller at step 0 (Checkpoints.restore resumes it);
    `rm_features`: a reward model scores, so the state tracks its features (klguard.reward.rm_outliers)."""
    actor, ref, critic = load_models(cfg, ctx, policy_path, resume_from)
    actor_optim, actor_sched = build_optimizer(actor, cfg.actor_rollout_ref.actor.optim, total_steps)
    critic_optim, critic_sched = (build_optimizer(critic, cfg.critic.optim, total_steps) if critic is not None
                                  else (None, None))
    return TrainState(actor=actor, actor_optim=actor_optim, actor_sched=actor_sched,
                      kl_ctrl=build_kl_controller(**vars(cfg.algorithm.kl_ctrl) | {"kl_coef": initial_kl_coef(cfg)}),
                      sampler=sampler, ref=ref, ref_in_actor=uses_reference(cfg) and ref is None, critic=critic,
                      critic_optim=critic_optim, critic_sched=critic_sched,
                      rm_outliers=RMFeatureOutliers(cfg.guard.baseline_window, cfg.guard.rm_outlier_quantile)
                      if rm_features else None)
