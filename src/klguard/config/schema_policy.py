"""The schema's policy-side sections: `actor_rollout_ref.*` (model, actor, rollout, reference) and `critic.*`.

Conventions: see klguard.fields; klguard.config.schema assembles the whole tree and re-exports these.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Literal, get_args

from klguard.algo.kl import KLEstimator
from klguard.algo.loss import LossAggMode
from klguard.algo.policy_loss_registry import policy_loss_names
from klguard.fields import (
    Rule,
    at_least,
    choices,
    fail,
    finite,
    greater,
    interval,
    non_negative,
    one_of,
    opt,
    positive,
    section,
    whole,
)

BUILTIN_MODEL = "builtin://tiny-arith"
"""Sentinel model path: the tiny Llama warm-started by `klguard sft` on the built-in task (cached)."""

Strategy = Literal["fsdp2", "fsdp", "fsdp_turbo", "none"]
DType = Literal["bfloat16", "bf16", "float32", "fp32", "auto"]
LRScheduler = Literal["constant", "cosine"]
RolloutName = Literal["hf", "vllm", "sglang", "trtllm"]
ProfilerContent = Literal["cpu", "cuda", "memory", "shapes", "stack"]  # verl's tool_config.torch.contents
PROFILER_CONTENTS: tuple[str, ...] = get_args(ProfilerContent)

FULL_KL_REFUSED = {"full": "is refused: klguard does not implement the full-vocabulary KL (it keeps no full "
                           "logits); use low_var_kl or kl"}
_MICRO = at_least(1)  # a micro-batch size, null = all at once
_TOP_K = Rule(lambda v: v >= -1, "must be -1 (off) or >= 0")


# ----------------------------------------------------------------------------- actor / rollout / ref
@dataclass
class ModelConfig:
    path: str = opt(BUILTIN_MODEL, f"Local HF model folder; {BUILTIN_MODEL} = the built-in tiny policy")
    tokenizer_path: str | None = opt(None, "Tokenizer folder (null = model.path)")
    trust_remote_code: bool = opt(False, "Allow model code shipped inside the model folder")
    override_config: dict = opt({}, "Overrides applied to the model's HF config before loading")
    enable_gradient_checkpointing: bool = opt(
        False, "Recompute activations in backward (verl: true; off because the demo model is tiny)"
    )
    custom_chat_template: str | None = opt(None, "A Jinja chat template replacing the tokenizer's")
    share_prompt_forward: bool = opt(
        True, "Run each group's identical prompt once in the reference, actor and critic forwards (rollout.n > 1; "
        "the same numbers up to float rounding)"
    )
    lora_rank: int = opt(0, "LoRA rank of the actor's adapters (PEFT; only they train); 0 = full fine-tuning",
                         rule=at_least(0))
    lora_alpha: int = opt(16, "LoRA alpha: the adapters' update is scaled by lora_alpha / lora_rank", rule=positive)
    target_modules: Any = opt("all-linear", "The linear layers given adapters: all-linear (every linear but the "
                              "output head), or a list of module names such as [q_proj, v_proj]")
    exclude_modules: Any = opt(None, "Module names left without adapters (null = none)")

    def check(self, key: str) -> None:
        for name in ("target_modules", "exclude_modules"):
            value = getattr(self, name)
            if name == "exclude_modules" and value is None:
                continue
            if not (isinstance(value, str) and value) and not (
                    isinstance(value, list) and value and all(isinstance(v, str) and v for v in value)):
                fail(f"{key}.{name}", value, "must be a module name or a list of them")


@dataclass
class OptimConfig:
    lr: float = opt(1e-4, "Learning rate (verl actor: 1e-6; 1e-4 sizes the built-in demo)", rule=positive)
    weight_decay: float = opt(0.01, "AdamW weight decay", rule=non_negative)
    betas: list = opt([0.9, 0.999], "AdamW betas")
    lr_warmup_steps: int = opt(-1, "Linear warm-up steps (-1 = use lr_warmup_steps_ratio)")
    lr_warmup_steps_ratio: float = opt(
        0.0, "Warm-up steps as a share of total training steps", rule=interval("[0, 1)")
    )
    lr_scheduler_type: LRScheduler = opt("constant", f"Learning-rate schedule after warm-up: {choices(LRScheduler)}")
    min_lr_ratio: float = opt(0.0, "Cosine schedule floor as a share of lr")
    num_cycles: float = opt(0.5, "Cosine schedule cycles")

    def check(self, key: str) -> None:
        if len(self.betas) != 2 or not all(0 <= b < 1 for b in self.betas):
            fail(f"{key}.betas", self.betas, "must be two numbers in [0, 1)")


ACTOR_TP_KEY = "actor_rollout_ref.actor.fsdp_config.turbo_config.distributed.tensor_parallel_size"
_TP_HELP = ("Ranks each decoder layer is split over (strategy=fsdp_turbo): q/k/v, gate and up by columns, o and "
            "down by rows, the embedding and lm_head by vocabulary; FSDP2 shards over the other ranks")


@dataclass
class TurboDistributedConfig:
    tensor_parallel_size: int = opt(1, _TP_HELP, rule=at_least(1))


@dataclass
class FollowingTurboDistributedConfig:
    tensor_parallel_size: int = opt("${" + ACTOR_TP_KEY + "}", _TP_HELP + " (default: the actor's; verl: 1; klguard "
                                    "runs one mesh, so it must equal the actor's)", rule=at_least(1))


@dataclass
class TurboConfig:
    distributed: TurboDistributedConfig = section(TurboDistributedConfig, "Parallel sizes (verl 0.9.1 fsdp_turbo)")


@dataclass
class FollowingTurboConfig:
    distributed: FollowingTurboDistributedConfig = section(
        FollowingTurboDistributedConfig, "Parallel sizes (verl 0.9.1 fsdp_turbo; they follow the actor's)")


@dataclass
class ShardingConfig:
    fsdp_size: int = opt(
        -1, "Ranks one model is sharded over (-1 = all); fewer builds a 2-D (replicate x shard) mesh, HSDP",
        rule=Rule(lambda v: v == -1 or v >= 1, "must be -1 (all ranks) or >= 1"),
    )
    offload_policy: bool = opt(
        False, "Keep parameters, gradients and optimizer states on the CPU (FSDP2 CPUOffloadPolicy; CUDA only). The "
        "actor's key also turns FSDP2 on in one process (a one-rank mesh; on a CPU nothing is offloaded)"
    )
    reshard_after_forward: bool = opt(
        True, "Free each layer's gathered weights after its forward (less memory, one more all-gather in backward)"
    )
    turbo_config: FollowingTurboConfig = section(FollowingTurboConfig,
                                                 "strategy=fsdp_turbo: tensor parallelism inside FSDP2")


@dataclass
class RefFSDPConfig(ShardingConfig):
    offload_policy: bool = opt(
        True, "Keep the reference's shards on the CPU (verl offloads the FSDP2 reference whatever its key says)"
    )


@dataclass
class FSDPConfig(ShardingConfig):
    dtype: DType = opt(
        "auto", "Compute dtype, weights stay fp32: " + choices(
            DType, bfloat16="autocast", bf16="= bfloat16", fp32="= float32",
            auto="bfloat16 on a GPU that has it, else float32") + " (verl: bfloat16; auto keeps CPU runs exact)"
    )
    turbo_config: TurboConfig = section(TurboConfig, "strategy=fsdp_turbo: tensor parallelism inside FSDP2")


@dataclass
class CriticFSDPConfig(FSDPConfig):
    turbo_config: FollowingTurboConfig = section(FollowingTurboConfig,
                                                 "strategy=fsdp_turbo: tensor parallelism inside FSDP2")


@dataclass
class TorchProfilerToolConfig:
    contents: list = opt([], f"What the torch profiler records, any of: {choices(ProfilerContent)} ([] = cpu, and "
                         "cuda on a GPU run)")

    def check(self, key: str) -> None:
        for item in self.contents:
            one_of(f"{key}.contents", item, ProfilerContent)


@dataclass
class ActorProfilerToolConfig:
    torch: TorchProfilerToolConfig = section(TorchProfilerToolConfig, "Options of global_profiler.tool=torch")


@dataclass
class ActorProfilerConfig:
    all_ranks: bool = opt(False, "Every rank writes a trace of the global_profiler steps")
    ranks: list = opt([], "Ranks that write traces when all_ranks is false ([] = rank 0; verl: no rank); one process "
                      "runs every role, so one trace covers rollout, reference, critic and updates",
                      rule=Rule(lambda v: all(whole(r, 0) for r in v), "must be a list of ranks >= 0"))
    tool_config: ActorProfilerToolConfig = section(ActorProfilerToolConfig, "Per-tool options")


@dataclass
class PolicyLossConfig:
    loss_mode: str = opt(
        "vanilla", "Policy loss (docs/training.md): " + ", ".join(policy_loss_names()),
        rule=Rule(lambda v: v in policy_loss_names(), "must be one of: " + ", ".join(policy_loss_names())))
    clip_cov_ratio: float = opt(0.0002, "clip_cov: share of the valid tokens whose gradient is cut",
                                rule=interval("(0, 1]"))
    clip_cov_lb: float = opt(1.0, "clip_cov: a token may be cut when its advantage-logprob covariance is above this",
                             rule=finite)
    clip_cov_ub: float = opt(5.0, "clip_cov: ... and below this", rule=finite)
    kl_cov_ratio: float = opt(0.0002, "kl_cov: share of the valid tokens, highest covariance first, given the KL "
                              "penalty", rule=interval("(0, 1]"))
    ppo_kl_coef: float = opt(0.1, "kl_cov: coefficient of the |log-ratio| penalty on those tokens", rule=non_negative)
    dro_beta: float | None = opt(None, "dro: coefficient of its quadratic log-ratio penalty (required by dro)",
                                 rule=positive)

    def check(self, key: str) -> None:
        if self.loss_mode == "dro" and self.dro_beta is None:
            fail(f"{key}.dro_beta", None, "must be set (a number > 0) when loss_mode=dro")
        if self.clip_cov_lb >= self.clip_cov_ub:
            fail(f"{key}.clip_cov_lb", self.clip_cov_lb, f"must be < clip_cov_ub ({self.clip_cov_ub})")


# Their clip ratios bound an importance weight's truncation, not a trust region: any number > 0.
WIDE_CLIP_LOSSES = ("cispo",)
_CLIP_KEYS = ("clip_ratio", "clip_ratio_low", "clip_ratio_high")
_CLIP_RANGE = interval("(0, 1)")


def _check_clip_ratios(actor: ActorConfig, key: str) -> None:
    mode = actor.policy_loss.loss_mode
    for name in _CLIP_KEYS:
        value = getattr(actor, name)
        if mode in WIDE_CLIP_LOSSES:
            positive.check(f"{key}.{name}", value)
        elif value is not None and not _CLIP_RANGE.ok(value):
            fail(f"{key}.{name}", value, f"must be in (0, 1) with policy_loss.loss_mode={mode} (only "
                 f"{', '.join(WIDE_CLIP_LOSSES)} takes bounds >= 1)")


@dataclass
class ActorConfig:
    strategy: Strategy = opt(
        "fsdp2", f"Parallelism under torchrun: {choices(Strategy, fsdp='alias of fsdp2', none='replicated, as DDP')}"
        "; one process runs unsharded"
    )
    ppo_mini_batch_size: int = opt(
        32, "Prompts per optimizer step, before rollout.n (verl: 256; demo-sized)", rule=at_least(1)
    )
    ppo_micro_batch_size_per_gpu: int | None = opt(
        None, "Rollouts per forward/backward on one device (null = the whole mini-batch)", rule=_MICRO
    )
    ppo_epochs: int = opt(1, "Passes over each rollout batch", rule=at_least(1))
    shuffle: bool = opt(False, "Shuffle rollouts before splitting into mini-batches")
    clip_ratio: float = opt(0.2, "PPO clip range epsilon, in (0, 1) as clip_ratio_low/high are (cispo: any number > 0, "
                            "its truncation bounds)")
    clip_ratio_low: float | None = opt(
        None, "Lower clip range (null = clip_ratio; verl defaults it to 0.2, silently overriding clip_ratio)"
    )
    clip_ratio_high: float | None = opt(None, "Upper clip range (null = clip_ratio; see clip_ratio_low)")
    use_dual_clip: bool = opt(True, "Dual-clip PPO for negative advantages in the vanilla loss (ours; verl always "
                              "applies it)")
    clip_ratio_c: float = opt(3.0, "Dual-clip bound: a negative-advantage token's loss is at most c*|A| (dppo_*: the "
                              "ratio weight's cap)", rule=greater(1))
    loss_agg_mode: LossAggMode = opt("token-mean", f"Loss aggregation: {choices(LossAggMode)}")
    policy_loss: PolicyLossConfig = section(PolicyLossConfig, "Which policy loss the actor's update minimises")
    tau_pos: float = opt(1.0, "sapo: gate temperature where A > 0 (larger: the gradient fades sooner as the ratio "
                         "leaves 1)", rule=positive)
    tau_neg: float = opt(1.05, "sapo: gate temperature where A <= 0", rule=positive)
    entropy_coeff: float = opt(0.0, "Entropy bonus coefficient", rule=non_negative)
    use_kl_loss: bool = opt(False, "Add beta * KL(actor || ref) to the actor loss (GRPO style)")
    kl_loss_coef: float = opt(0.001, "Coefficient of the KL loss; with the KL as a loss only (use_kl_in_reward=false) "
                              "its starting value: algorithm.kl_ctrl and the guard then steer it", rule=non_negative)
    kl_loss_type: KLEstimator = opt(
        "low_var_kl", "KL estimator of the KL loss (see algorithm.kl_penalty)", unsupported=FULL_KL_REFUSED
    )
    grad_clip: float = opt(1.0, "Clip the actor's gradient norm to this (<= 0 disables clipping)")
    optim: OptimConfig = section(OptimConfig, "Actor optimizer (AdamW)")
    fsdp_config: FSDPConfig = section(FSDPConfig, "Precision of the actor, the reference and the reward model")
    profiler: ActorProfilerConfig = section(ActorProfilerConfig, "Ranks and contents of global_profiler traces")

    def check(self, key: str) -> None:
        _check_clip_ratios(self, key)


def _check_temperature(sampling: ValKwargs | RolloutConfig, key: str) -> None:
    if sampling.do_sample and not (math.isfinite(sampling.temperature) and sampling.temperature > 0):
        fail(f"{key}.temperature", sampling.temperature, "must be > 0 when do_sample is true")


@dataclass
class ValKwargs:
    temperature: float = opt(0.0, "Validation sampling temperature (0 = greedy)")
    top_k: int = opt(-1, "Validation top-k (-1 = off)", rule=_TOP_K)
    top_p: float = opt(1.0, "Validation top-p", rule=interval("(0, 1]"))
    n: int = opt(1, "Samples per validation prompt")
    do_sample: bool = opt(False, "Sample at validation (false = greedy)")

    def check(self, key: str) -> None:
        _check_temperature(self, key)


@dataclass
class RolloutConfig:
    name: RolloutName = opt(
        "hf", f"Rollout engine: {choices(RolloutName, hf='transformers forward with a KV cache')}; klguard samples "
        "with hf whichever is named (one warning)"
    )
    temperature: float = opt(1.0, "Sampling temperature")
    top_k: int = opt(-1, "Top-k sampling (-1 = off)", rule=_TOP_K)
    top_p: float = opt(1.0, "Top-p sampling (1.0 = off)", rule=interval("(0, 1]"))
    do_sample: bool = opt(True, "Sample (false = greedy)")
    n: int = opt(1, "Responses per prompt (>1 for group estimators such as GRPO and RLOO)", rule=at_least(1))
    ignore_eos: bool = opt(False, "Generate max_response_length tokens regardless of EOS")
    enforce_eager: bool = opt(True, "false: the decode step runs compiled (torch.compile, static KV cache); verl: "
                              "false, here true: compiling costs seconds per batch shape and needs a C++ compiler")
    tensor_model_parallel_size: int = opt(
        1, "Under tensor parallelism, ranks one rollout replica spans: 1 = each rank generates on a whole copy of "
        "the policy gathered once a step, the actor's tensor_parallel_size = generation on the tp shards "
        "(verl: 2, vLLM's); no effect without tensor parallelism", rule=at_least(1))
    pipeline_model_parallel_size: int = opt(
        1, "Pipeline stages: klguard has no pipeline parallelism (docs/distributed.md says why), so only 1",
        rule=Rule(lambda v: v == 1, "must be 1: klguard has no pipeline parallelism (docs/distributed.md)"))
    val_kwargs: ValKwargs = section(ValKwargs, "Sampling settings at validation")

    def check(self, key: str) -> None:
        _check_temperature(self, key)


@dataclass
class RefConfig:
    log_prob_micro_batch_size_per_gpu: int | None = opt(
        None, "Rollouts per reference forward (null = all)", rule=_MICRO
    )
    fsdp_config: RefFSDPConfig = section(RefFSDPConfig, "Sharding of the reference (it follows the actor's strategy)")


@dataclass
class ActorRolloutRefConfig:
    model: ModelConfig = section(ModelConfig, "The policy model")
    actor: ActorConfig = section(ActorConfig, "Policy update")
    rollout: RolloutConfig = section(RolloutConfig, "Sampling")
    ref: RefConfig = section(RefConfig, "Frozen reference policy")


# ----------------------------------------------------------------------------- critic
@dataclass
class CriticModelConfig:
    path: str | None = opt(None, "Critic model folder (null = actor_rollout_ref.model.path)")
    override_config: dict = opt({}, "Overrides applied to the critic's HF config")
    enable_gradient_checkpointing: bool = opt(False, "Recompute activations in backward (verl: true)")
    fsdp_config: CriticFSDPConfig = section(CriticFSDPConfig, "Precision and sharding of the critic (verl 0.9.1: "
                                            "critic.fsdp.*, the same keys)")


@dataclass
class CriticOptimConfig(OptimConfig):
    lr: float = opt(1e-3, "Critic learning rate (verl: 1e-5; 1e-3 sizes the built-in demo)", rule=positive)


@dataclass
class CriticConfig:
    enable: bool | None = opt(None, "Train a critic (null = only when algorithm.adv_estimator is gae)")
    strategy: Strategy = opt(
        "fsdp2", f"Parallelism under torchrun: {choices(Strategy, fsdp='alias', none='replicated')}"
    )
    model: CriticModelConfig = section(CriticModelConfig, "The value model (a token-classification head)")
    optim: CriticOptimConfig = section(CriticOptimConfig, "Critic optimizer (AdamW)")
    ppo_mini_batch_size: int = opt(
        "${actor_rollout_ref.actor.ppo_mini_batch_size}", "Prompts per critic step", rule=at_least(1)
    )
    ppo_micro_batch_size_per_gpu: int | None = opt(
        None, "Rollouts per critic forward/backward (null = all)", rule=_MICRO
    )
    ppo_epochs: int = opt("${actor_rollout_ref.actor.ppo_epochs}", "Passes over each batch for the critic",
                          rule=at_least(1))
    shuffle: bool = opt("${actor_rollout_ref.actor.shuffle}", "Shuffle before splitting into mini-batches")
    cliprange_value: float = opt(0.5, "Value clip range around the rollout-time values", rule=positive)
    loss_agg_mode: LossAggMode = opt("${actor_rollout_ref.actor.loss_agg_mode}", "Value loss aggregation mode")
    grad_clip: float = opt(1.0, "Clip the critic's gradient norm to this (<= 0 disables)")
