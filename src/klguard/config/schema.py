"""The typed configuration schema: verl's key tree for what klguard implements, plus our own sections.

Every field carries a one-line description in its metadata (`help`). Defaults follow verl's
(`shared/reference/verl_ppo_trainer_keys.txt`) unless the description says why we differ; most
differences size the built-in demo so that `klguard train` with no arguments runs on a laptop CPU.
Strings of the form `${...}` are OmegaConf interpolations, as in verl.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from typing import Any

from klguard.guard.config import GuardConfig

BUILTIN_MODEL = "builtin://tiny-arith"
"""Sentinel model path: the tiny Llama warm-started by `klguard sft` on the built-in task (cached)."""


def opt(default: Any, help: str) -> Any:
    """A schema field with a default and a one-line description."""
    if isinstance(default, (list, dict)):
        return field(default_factory=lambda: copy.deepcopy(default), metadata={"help": help})
    return field(default=default, metadata={"help": help})


def section(cls: type, help: str) -> Any:
    return field(default_factory=cls, metadata={"help": help})


# ----------------------------------------------------------------------------- data
@dataclass
class DataConfig:
    train_files: Any = opt(None, "Parquet file(s) in verl's row format; null = generate the built-in arithmetic task")
    val_files: Any = opt(None, "Validation parquet file(s); null = the built-in task's held-out split")
    train_max_samples: int = opt(-1, "Use at most this many training rows (-1 = all)")
    val_max_samples: int = opt(-1, "Use at most this many validation rows (-1 = all)")
    prompt_key: str = opt("prompt", "Column holding the chat message list")
    reward_fn_key: str = opt("data_source", "Column that selects the rule reward function")
    max_prompt_length: int = opt(512, "Longest prompt in tokens after the chat template")
    max_response_length: int = opt(
        32, "Most tokens generated per response (verl: 512; 32 sizes the built-in demo)"
    )
    train_batch_size: int = opt(64, "Prompts per PPO step (verl: 1024; 64 sizes the built-in demo)")
    val_batch_size: int | None = opt(None, "Prompts per validation batch (null = the whole split at once)")
    shuffle: bool = opt(True, "Shuffle the training prompts every epoch")
    seed: int | None = opt(None, "Seed of the dataloader shuffle (null = trainer.seed)")
    validation_shuffle: bool = opt(False, "Shuffle the validation prompts")
    filter_overlong_prompts: bool = opt(False, "Drop prompts longer than max_prompt_length instead of failing")
    truncation: str = opt(
        "error", "Overlong prompts: error | left (keep the end) | right (keep the start) | middle (keep both ends)"
    )
    apply_chat_template_kwargs: dict = opt({}, "Extra keyword arguments for tokenizer.apply_chat_template")
    builtin_train_size: int = opt(4096, "Rows of the built-in task's training split (ours)")
    builtin_val_size: int = opt(256, "Rows of the built-in task's validation split (ours)")
    builtin_form: str = opt("a+b-c", "Built-in problem family: a+b-c | mixed (two and three operands) | two (ours)")


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


@dataclass
class OptimConfig:
    lr: float = opt(1e-4, "Learning rate (verl actor: 1e-6; 1e-4 sizes the built-in demo)")
    weight_decay: float = opt(0.01, "AdamW weight decay")
    betas: list = opt([0.9, 0.999], "AdamW betas")
    lr_warmup_steps: int = opt(-1, "Linear warm-up steps (-1 = use lr_warmup_steps_ratio)")
    lr_warmup_steps_ratio: float = opt(0.0, "Warm-up steps as a share of total training steps")
    lr_scheduler_type: str = opt("constant", "Learning-rate schedule after warm-up: constant | cosine")
    min_lr_ratio: float = opt(0.0, "Cosine schedule floor as a share of lr")
    num_cycles: float = opt(0.5, "Cosine schedule cycles")


@dataclass
class ShardingConfig:
    fsdp_size: int = opt(
        -1, "Ranks one model is sharded over (-1 = all); fewer builds a 2-D (replicate x shard) mesh, HSDP"
    )
    offload_policy: bool = opt(
        False, "Keep parameters, gradients and optimizer states on the CPU (FSDP2 CPUOffloadPolicy; CUDA only)"
    )
    reshard_after_forward: bool = opt(
        True, "Free each layer's gathered weights after its forward (less memory, one more all-gather in backward)"
    )


@dataclass
class RefFSDPConfig(ShardingConfig):
    offload_policy: bool = opt(
        True, "Keep the reference's shards on the CPU (verl offloads the FSDP2 reference whatever its key says)"
    )


@dataclass
class FSDPConfig(ShardingConfig):
    dtype: str = opt(
        "auto", "Compute dtype, weights stay fp32: bfloat16 (autocast) | float32 | auto = bfloat16 on a GPU that "
        "has it, else float32 (verl: bfloat16; auto keeps CPU runs exact)"
    )


@dataclass
class TorchProfilerToolConfig:
    contents: list = opt([], "What the torch profiler records: cpu, cuda, memory, shapes, stack ([] = cpu, and cuda "
                         "on a GPU run)")


@dataclass
class ActorProfilerToolConfig:
    torch: TorchProfilerToolConfig = section(TorchProfilerToolConfig, "Options of global_profiler.tool=torch")


@dataclass
class ActorProfilerConfig:
    all_ranks: bool = opt(False, "Every rank writes a trace of the global_profiler steps")
    ranks: list = opt([], "Ranks that write traces when all_ranks is false ([] = rank 0; verl: no rank); one process "
                      "runs every role, so one trace covers rollout, reference, critic and updates")
    tool_config: ActorProfilerToolConfig = section(ActorProfilerToolConfig, "Per-tool options")


@dataclass
class ActorConfig:
    strategy: str = opt(
        "fsdp2", "Parallelism under torchrun: fsdp2 | fsdp (alias of fsdp2) | none (replicated, as DDP); one process "
        "runs unsharded"
    )
    ppo_mini_batch_size: int = opt(32, "Prompts per optimizer step, before rollout.n (verl: 256; demo-sized)")
    ppo_micro_batch_size_per_gpu: int | None = opt(
        None, "Rollouts per forward/backward on one device (null = the whole mini-batch)"
    )
    ppo_epochs: int = opt(1, "Passes over each rollout batch")
    shuffle: bool = opt(False, "Shuffle rollouts before splitting into mini-batches")
    clip_ratio: float = opt(0.2, "PPO clip range epsilon")
    clip_ratio_low: float | None = opt(
        None, "Lower clip range (null = clip_ratio; verl defaults it to 0.2, silently overriding clip_ratio)"
    )
    clip_ratio_high: float | None = opt(None, "Upper clip range (null = clip_ratio; see clip_ratio_low)")
    use_dual_clip: bool = opt(True, "Dual-clip PPO for negative advantages (ours; verl always applies it)")
    clip_ratio_c: float = opt(3.0, "Dual-clip bound: a negative-advantage token's loss is at most c*|A|")
    loss_agg_mode: str = opt(
        "token-mean",
        "Loss aggregation: token-mean | seq-mean-token-sum | seq-mean-token-mean | seq-mean-token-sum-norm",
    )
    entropy_coeff: float = opt(0.0, "Entropy bonus coefficient")
    use_kl_loss: bool = opt(False, "Add beta * KL(actor || ref) to the actor loss (GRPO style)")
    kl_loss_coef: float = opt(0.001, "Coefficient of the KL loss")
    kl_loss_type: str = opt("low_var_kl", "KL estimator of the KL loss (see algorithm.kl_penalty)")
    grad_clip: float = opt(1.0, "Clip the actor's gradient norm to this (<= 0 disables clipping)")
    optim: OptimConfig = section(OptimConfig, "Actor optimizer (AdamW)")
    fsdp_config: FSDPConfig = section(FSDPConfig, "Precision of the actor, the reference and the reward model")
    profiler: ActorProfilerConfig = section(ActorProfilerConfig, "Ranks and contents of global_profiler traces")


@dataclass
class ValKwargs:
    temperature: float = opt(0.0, "Validation sampling temperature (0 = greedy)")
    top_k: int = opt(-1, "Validation top-k (-1 = off)")
    top_p: float = opt(1.0, "Validation top-p")
    n: int = opt(1, "Samples per validation prompt")
    do_sample: bool = opt(False, "Sample at validation (false = greedy)")


@dataclass
class RolloutConfig:
    name: str = opt("hf", "Rollout engine: hf (transformers forward with a KV cache, the only one here)")
    temperature: float = opt(1.0, "Sampling temperature")
    top_k: int = opt(-1, "Top-k sampling (-1 = off)")
    top_p: float = opt(1.0, "Top-p sampling (1.0 = off)")
    do_sample: bool = opt(True, "Sample (false = greedy)")
    n: int = opt(1, "Responses per prompt (>1 for group estimators such as GRPO and RLOO)")
    ignore_eos: bool = opt(False, "Generate max_response_length tokens regardless of EOS")
    enforce_eager: bool = opt(True, "false: the decode step runs compiled (torch.compile, static KV cache); verl: "
                              "false, here true: compiling costs seconds per batch shape and needs a C++ compiler")
    log_prob_micro_batch_size_per_gpu: int | None = opt(None, "Rollouts per old-log-prob forward (null = all)")
    val_kwargs: ValKwargs = section(ValKwargs, "Sampling settings at validation")


@dataclass
class RefConfig:
    log_prob_micro_batch_size_per_gpu: int | None = opt(None, "Rollouts per reference forward (null = all)")
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
    fsdp_config: FSDPConfig = section(FSDPConfig, "Precision of the critic")


@dataclass
class CriticOptimConfig(OptimConfig):
    lr: float = opt(1e-3, "Critic learning rate (verl: 1e-5; 1e-3 sizes the built-in demo)")


@dataclass
class CriticConfig:
    enable: bool | None = opt(None, "Train a critic (null = only when algorithm.adv_estimator is gae)")
    strategy: str = opt("fsdp2", "Parallelism under torchrun: fsdp2 | fsdp (alias) | none (replicated)")
    model: CriticModelConfig = section(CriticModelConfig, "The value model (a token-classification head)")
    optim: CriticOptimConfig = section(CriticOptimConfig, "Critic optimizer (AdamW)")
    ppo_mini_batch_size: int = opt("${actor_rollout_ref.actor.ppo_mini_batch_size}", "Prompts per critic step")
    ppo_micro_batch_size_per_gpu: int | None = opt(None, "Rollouts per critic forward/backward (null = all)")
    ppo_epochs: int = opt("${actor_rollout_ref.actor.ppo_epochs}", "Passes over each batch for the critic")
    shuffle: bool = opt("${actor_rollout_ref.actor.shuffle}", "Shuffle before splitting into mini-batches")
    cliprange_value: float = opt(0.5, "Value clip range around the rollout-time values")
    loss_agg_mode: str = opt("${actor_rollout_ref.actor.loss_agg_mode}", "Value loss aggregation mode")
    grad_clip: float = opt(1.0, "Clip the critic's gradient norm to this (<= 0 disables)")


# ----------------------------------------------------------------------------- rewards
@dataclass
class RewardModelModelConfig:
    path: str | None = opt(None, "Local HF folder of an AutoModelForSequenceClassification reward model (one label)")
    trust_remote_code: bool = opt(False, "Allow model code shipped inside the reward model folder")
    override_config: dict = opt({}, "Overrides applied to the reward model's HF config before loading")


@dataclass
class RewardModelConfig:
    enable: bool = opt(False, "Score responses with a sequence-classification reward model")
    model: RewardModelModelConfig = section(RewardModelModelConfig, "The reward model")
    micro_batch_size_per_gpu: int | None = opt(None, "Sequences per reward-model forward (null = the whole batch)")
    max_length: int | None = opt(None, "Longest prompt+response the RM reads, in its tokens; longer keep the end")
    length_penalty: float = opt(
        0.0, "Subtracted from the RM score per response token: RM(q, o) - length_penalty * |o| (ours)"
    )
    rule_weight: float = opt(
        0.0, "Add this times the rule/custom score to the RM score (ours; 0 = verl, the RM score alone)"
    )


@dataclass
class CustomRewardFunctionConfig:
    path: str | None = opt(None, "Python file with the reward function (the only user code run)")
    name: str = opt("compute_score", "Function name in that file")


@dataclass
class ProxyRewardConfig:
    enable: bool | None = opt(
        None, "Optimise the length-biased proxy instead of the rule score; the rule score is kept as gold "
        "(null = on for the built-in task only) (ours)"
    )
    format_weight: float = opt(0.5, "Proxy weight of a well-formed '#### <number>' answer at the start")
    correct_weight: float = opt(0.5, "Proxy weight of the FIRST answer being correct")
    length_weight: float = opt(1.0, "Proxy weight of min(tokens, length_cap) / length_cap: the length bias")
    length_cap: int = opt(32, "Tokens beyond which length earns no more proxy reward")


# ----------------------------------------------------------------------------- algorithm
@dataclass
class KLCtrlConfig:
    type: str = opt("fixed", "KL controller: fixed | adaptive (Ziegler et al. 2019) | pid (PI on log beta, ours)")
    kl_coef: float = opt(
        0.05, "Initial KL coefficient beta (verl: 0.001, which lets the demo hack; the guard raises it on hacking)"
    )
    horizon: int = opt(10000, "Adaptive controller horizon in rollouts")
    target_kl: float = opt(0.015, "Controller's KL target in kl_unit (verl: 0.1; the seed: 0.015)")
    kl_unit: str = opt(
        "token_mean", "KL the controller sees: token_mean (verl, per token) | seq_sum (per sequence, as TRL) (ours)"
    )
    kp: float = opt(0.5, "pid: proportional gain on log(KL / target)")
    ki: float = opt(0.1, "pid: integral gain on log(KL / target)")
    kd: float = opt(0.0, "pid: derivative gain")


@dataclass
class AlgorithmConfig:
    gamma: float = opt(1.0, "Discount factor")
    lam: float = opt(0.95, "GAE lambda (verl: 1.0)")
    adv_estimator: str = opt(
        "gae", "Advantage estimator: gae | grpo | rloo | reinforce_plus_plus | reinforce_plus_plus_baseline"
    )
    norm_adv_by_std_in_grpo: bool = opt(True, "Divide GRPO advantages by the group's std")
    use_kl_in_reward: bool = opt(True, "Token rewards become score - beta * KL (verl: false)")
    kl_penalty: str = opt("kl", "KL estimator in the reward: kl|k1|abs|mse|k2|low_var_kl|k3, '+' suffix allowed")
    kl_ctrl: KLCtrlConfig = section(KLCtrlConfig, "KL coefficient controller")


# ----------------------------------------------------------------------------- trainer
@dataclass
class TrainerConfig:
    total_epochs: int = opt(30, "Passes over the training prompts (total_training_steps wins if set)")
    total_training_steps: int | None = opt(200, "PPO steps to run (verl: null = from total_epochs)")
    project_name: str = opt("klguard", "Project name for loggers and the run directory")
    experiment_name: str = opt("arith_demo", "Experiment name for loggers and the run directory")
    logger: list = opt(
        ["console", "jsonl", "tensorboard"], "Trackers: console, jsonl (alias file), tensorboard, wandb, mlflow"
    )
    save_freq: int = opt(10, "Checkpoint every N steps (-1 = only at the end); the guard rolls back to these")
    resume_mode: str = opt("auto", "auto (latest checkpoint in default_local_dir) | disable | resume_path")
    resume_from_path: str | None = opt(None, "Checkpoint folder to resume from when resume_mode=resume_path")
    val_before_train: bool = opt(True, "Validate before the first step")
    test_freq: int = opt(10, "Validate every N steps (-1 = only at the end)")
    critic_warmup: int = opt(0, "Steps that train only the critic")
    default_local_dir: str = opt(
        "checkpoints/${trainer.project_name}/${trainer.experiment_name}", "Run directory"
    )
    max_actor_ckpt_to_keep: int | None = opt(None, "Keep at most this many checkpoints (null = all)")
    device: str = opt("auto", "cpu | cuda | auto (verl: cuda)")
    seed: int = opt(1, "Seeds every RNG (torch, numpy, python, sampling) so a CPU run is reproducible (ours)")
    progress_bar: bool = opt(True, "Show a live progress bar (ours)")
    report: bool = opt(True, "Write report.html (curves, guard actions) into the run directory at the end (ours)")
    dist_timeout_s: float = opt(
        1800.0, "Seconds a rank waits in a collective before the job fails instead of hanging (torchrun runs; ours)"
    )
    debug: bool = opt(
        False, "Check every step that all ranks hold the same KL coefficient, guard state and metrics (ours)"
    )
    max_nonfinite_steps: int = opt(
        3, "Pause after this many steps in a row skipped for a NaN/Inf in rewards, log-probs, KL, loss or grads (ours)"
    )


# ----------------------------------------------------------------------------- profiler
@dataclass
class GlobalProfilerConfig:
    tool: str | None = opt(None, "Profiler: null (off) | torch (torch.profiler traces of global_profiler.steps)")
    steps: list | None = opt(None, "Training steps to profile, 1-based, e.g. [3, 4] (null = none)")
    profile_continuous_steps: bool = opt(False, "Consecutive listed steps share one trace (false: one per step)")
    save_path: str = opt(
        "${trainer.default_local_dir}/profile", "Where traces go, one folder per profiled step (verl: outputs/profile)"
    )


# ----------------------------------------------------------------------------- sft (built-in policy)
@dataclass
class SFTConfig:
    steps: int = opt(4000, "Most SFT steps of the built-in tiny policy (the cosine schedule spans these)")
    batch_size: int = opt(64, "SFT sequences per step")
    lr: float = opt(2e-3, "SFT peak learning rate (AdamW, linear warm-up then cosine decay)")
    warmup_steps: int = opt(100, "SFT warm-up steps")
    continue_rate: float = opt(
        0.05, "Share of SFT targets that run on into a second packed problem: gives the reference a small "
        "chance of not stopping, without which nothing can hack"
    )
    target_accuracy: float = opt(0.55, "Stop SFT once held-out accuracy at temperature 1 reaches this")
    eval_every: int = opt(50, "Evaluate held-out accuracy every N SFT steps")
    seed: int = opt(0, "Seed of the SFT run")
    cache_dir: str | None = opt(None, "Where the SFT policy is cached (null = $KLGUARD_CACHE or ~/.cache/klguard)")


# ----------------------------------------------------------------------------- klguard calibrate
@dataclass
class CalibrateConfig:
    grid: list[float] = opt(
        [0.005, 0.01, 0.015, 0.02, 0.03, 0.05],
        "target_kl values swept by `klguard calibrate`, in algorithm.kl_ctrl.kl_unit",
    )
    controller: str = opt("adaptive", "KL controller each sweep run uses: adaptive | pid (target_kl must steer it)")
    horizon: int = opt(300, "Adaptive controller horizon for the sweep runs (short runs need a fast controller)")
    kl_coef: float = opt(0.05, "Initial kl_coef of every sweep run")
    max_hacking_rate: float = opt(0.1, "The recommendation keeps the final hacking rate at or under this")
    metric: str = opt(
        "val-core/", "Score to maximise: a metric name, or val-core/ = the first validation accuracy (gold on the demo)"
    )
    output_dir: str = opt("calibration", "Where the sweep's runs, calibration.json and report.html go")
    parallel: int | None = opt(None, "Sweep runs at once (null = one per two cores, all cores on a 2-core machine)")


@dataclass
class GuardSection(GuardConfig):
    enable: bool = opt(True, "Run the KL guard (false: plain verl behaviour)")


@dataclass
class Config:
    data: DataConfig = section(DataConfig, "Datasets")
    actor_rollout_ref: ActorRolloutRefConfig = section(ActorRolloutRefConfig, "Policy, rollout and reference")
    critic: CriticConfig = section(CriticConfig, "Value model")
    reward_model: RewardModelConfig = section(RewardModelConfig, "Model-based reward")
    custom_reward_function: CustomRewardFunctionConfig = section(CustomRewardFunctionConfig, "User reward function")
    proxy_reward: ProxyRewardConfig = section(ProxyRewardConfig, "The demo's length-biased proxy reward (ours)")
    algorithm: AlgorithmConfig = section(AlgorithmConfig, "Advantages and KL control")
    trainer: TrainerConfig = section(TrainerConfig, "Run length, logging, checkpoints")
    global_profiler: GlobalProfilerConfig = section(GlobalProfilerConfig, "torch.profiler traces of chosen steps")
    guard: GuardSection = section(GuardSection, "The KL guard: rules that watch the run and act (ours)")
    sft: SFTConfig = section(SFTConfig, "Supervised warm start of the built-in policy (ours)")
    calibrate: CalibrateConfig = section(CalibrateConfig, "`klguard calibrate`: the target_kl sweep (ours)")
