"""The typed configuration schema: verl's key tree for what klguard implements, plus our own sections.

Every field carries a one-line description in its metadata (`help`). Defaults follow verl's
(verl 0.9.1's generated `ppo_trainer.yaml`) unless the description says why we differ; most
differences size the built-in demo so that `klguard train` with no arguments runs on a laptop CPU.
Strings of the form `${...}` are OmegaConf interpolations, as in verl.

A choice field's type is a Literal, the one list of its values; a field's own range is the `rule` next to it;
a section's `check(key)` holds the rules over several of its fields (klguard.fields). Rules across
sections are in klguard.config.validate. The policy-side sections live in schema_policy.py.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from klguard.algo.advantage import AdvEstimator
from klguard.algo.kl import BaseKLEstimator, KLCtrlType, KLEstimator
from klguard.config.schema_policy import (
    BUILTIN_MODEL,
    FULL_KL_REFUSED,
    PROFILER_CONTENTS,
    ActorConfig,
    ActorRolloutRefConfig,
    CriticConfig,
    OptimConfig,
    ProfilerContent,
)
from klguard.config.schema_reward import (
    CustomRewardFunctionConfig,
    LearnedRMConfig,
    ProxyRewardConfig,
    RewardModelConfig,
)
from klguard.data.dataset import Truncation
from klguard.fields import (
    Rule,
    at_least,
    choices,
    fail,
    greater,
    interval,
    non_negative,
    one_of,
    opt,
    positive,
    section,
    whole,
)
from klguard.guard.config import GuardConfig

# what other modules import from here (the policy-side sections are schema_policy's)
__all__ = ["BUILTIN_MODEL", "PROFILER_CONTENTS", "ActorConfig", "ActorRolloutRefConfig", "Config", "CriticConfig",
           "CustomRewardFunctionConfig", "GuardConfig", "LearnedRMConfig", "OptimConfig", "ProfilerContent",
           "ProxyRewardConfig", "RewardModelConfig", "SFTConfig"]

KLUnit = Literal["token_mean", "seq_sum", "batch_token_mean"]
Logger = Literal["console", "jsonl", "file", "tensorboard", "wandb", "mlflow"]
ResumeMode = Literal["auto", "disable", "resume_path"]
Device = Literal["cpu", "cuda", "auto"]
ProfilerTool = Literal["torch"]
CalibrateController = Literal["adaptive", "pid"]  # the controllers a target_kl steers, of KLCtrlType
BuiltinForm = Literal["a+b-c", "mixed", "two"]  # the built-in task's problem families (klguard.builtin.arith.FORMS)
BuiltinTaskName = Literal["arith", "reviews", "constraints"]  # the built-in tasks (klguard.builtin.task.task_for)
_SIZE = at_least(1)
_EVERY = Rule(lambda v: v == -1 or v >= 1, "must be >= 1 or -1")


# ----------------------------------------------------------------------------- data
@dataclass
class DataConfig:
    train_files: Any = opt(None, "Parquet file(s) in verl's row format; null = the built-in task's (data.builtin_task)")
    val_files: Any = opt(None, "Validation parquet file(s); null = the built-in task's held-out split")
    train_max_samples: int = opt(-1, "Use at most this many training rows (-1 = all)")
    val_max_samples: int = opt(-1, "Use at most this many validation rows (-1 = all)")
    prompt_key: str = opt("prompt", "Column holding the chat message list")
    max_prompt_length: int = opt(512, "Longest prompt in tokens after the chat template", rule=_SIZE)
    max_response_length: int = opt(
        32, "Most tokens generated per response (verl: 512; 32 sizes the built-in demo)", rule=_SIZE
    )
    train_batch_size: int = opt(64, "Prompts per PPO step (verl: 1024; 64 sizes the built-in demo)", rule=_SIZE)
    val_batch_size: int | None = opt(None, "Prompts per validation batch (null = the whole split at once)")
    shuffle: bool = opt(True, "Shuffle the training prompts every epoch")
    seed: int | None = opt(None, "Seed of the dataloader shuffle (null = trainer.seed)")
    filter_overlong_prompts: bool = opt(False, "Drop prompts longer than max_prompt_length instead of failing")
    truncation: Truncation = opt("error", "Overlong prompts: " + choices(
        Truncation, left="keep the end", right="keep the start", middle="keep both ends"))
    apply_chat_template_kwargs: dict = opt({}, "Extra keyword arguments for tokenizer.apply_chat_template")
    builtin_task: BuiltinTaskName = opt("arith", "Built-in task: " + choices(
        BuiltinTaskName, arith="the toy's arithmetic on the built-in policy",
        reviews="one-sentence reviews scored by VADER, SmolLM2-135M-Instruct as the policy",
        constraints="one sentence under two verifiable constraints, scored by a verifier, SmolLM2 as well") + " (ours)")
    builtin_train_size: int = opt(4096, "Rows of the built-in task's training split (ours)", rule=_SIZE)
    builtin_val_size: int = opt(256, "Rows of the built-in task's validation split (ours)", rule=_SIZE)
    builtin_form: BuiltinForm = opt(
        "a+b-c", f"Built-in problem family: {choices(BuiltinForm, mixed='two and three operands')} (ours)"
    )

    def check(self, key: str) -> None:
        for name, value in (("train_files", self.train_files), ("val_files", self.val_files)):
            files = [value] if isinstance(value, str) else value
            if value is not None and (not isinstance(files, list) or not all(isinstance(f, str) for f in files)):
                fail(f"{key}.{name}", value, "must be a path or a list of paths")
        if (self.train_files is None) != (self.val_files is None):
            fail(f"{key}.val_files" if self.val_files is None else f"{key}.train_files", None,
                 "must be set together with the other (null for both = the built-in task)")


# ----------------------------------------------------------------------------- algorithm
@dataclass
class KLCtrlConfig:
    type: KLCtrlType = opt(
        "fixed", f"KL controller: {choices(KLCtrlType, adaptive='Ziegler et al. 2019', pid='PI on log beta, ours')}"
    )
    kl_coef: float = opt(
        0.05, "Initial KL coefficient beta (verl: 0.001, which lets the demo hack; the guard raises it on hacking)",
        rule=non_negative,
    )
    horizon: int = opt(10000, "Adaptive controller horizon in rollouts", rule=greater(0))
    target_kl: float = opt(
        0.015, "Controller's KL target in kl_unit (verl: 0.1; 0.015: guard.default_target_kl up to 32 nodes)",
        rule=positive)
    kl_unit: KLUnit = opt("token_mean", "KL the controller sees: " + choices(
        KLUnit, token_mean="verl, per token", seq_sum="per sequence, as TRL",
        batch_token_mean="per token, every token of the batch weighing the same") + " (ours)")
    kp: float = opt(0.5, "pid: proportional gain on log(KL / target)", rule=non_negative)
    ki: float = opt(0.1, "pid: integral gain on log(KL / target)", rule=non_negative)
    kd: float = opt(0.0, "pid: derivative gain", rule=non_negative)

    def check(self, key: str) -> None:
        if self.type in ("adaptive", "pid") and self.kl_coef == 0:
            fail(f"{key}.kl_coef", 0.0, f"must be > 0 with a {self.type} controller (it scales the value)")


FilterMetric = Literal["reward", "score", "seq_reward", "acc"]


@dataclass
class FilterGroupsConfig:
    enable: bool = opt(False, "DAPO's dynamic sampling: drop the groups whose responses all got the same metric, and "
                       "sample more prompts until data.train_batch_size groups remain")
    metric: FilterMetric = opt("reward", "What must differ inside a group: " + choices(
        FilterMetric, reward="the score PPO optimises (after overlong shaping)", score="the score before shaping",
        seq_reward="= score", acc="the gold/rule score where there is one, else the score"))
    max_num_gen_batches: int = opt(
        0, "Most generation batches per step before the step fails (<= 0: no limit)")
    max_inflight_gen_batches: int = opt(1, "Generation batches at once (klguard samples one at a time)",
                                        rule=at_least(1))


@dataclass
class AlgorithmConfig:
    gamma: float = opt(1.0, "Discount factor", rule=interval("[0, 1]"))
    lam: float = opt(0.95, "GAE lambda (verl: 1.0)", rule=interval("[0, 1]"))
    adv_estimator: AdvEstimator = opt("gae", f"Advantage estimator: {choices(AdvEstimator)}")
    norm_adv_by_std_in_grpo: bool = opt(True, "Divide GRPO advantages by the group's std")
    use_kl_in_reward: bool = opt(True, "Token rewards become score - beta * KL (verl: false)")
    kl_penalty: KLEstimator = opt(
        "kl", f"KL estimator in the reward: {choices(BaseKLEstimator)}, '+' suffix allowed",
        unsupported=FULL_KL_REFUSED,
    )
    kl_ctrl: KLCtrlConfig = section(KLCtrlConfig, "KL coefficient controller")
    filter_groups: FilterGroupsConfig = section(FilterGroupsConfig, "DAPO's dynamic sampling (group filtering)")
    gdpo_reward_keys: list | None = opt(
        None, "adv_estimator=gdpo: the keys of the reward function's returned dict normalised one by one")
    gdpo_reward_weights: list | None = opt(None, "adv_estimator=gdpo: one weight per reward key (null = 1 each)")

    def check(self, key: str) -> None:
        keys, weights = self.gdpo_reward_keys, self.gdpo_reward_weights
        if self.adv_estimator == "gdpo" and not keys:
            fail(f"{key}.gdpo_reward_keys", keys, "must list the reward function's score keys for adv_estimator=gdpo")
        if keys is not None and not all(isinstance(k, str) for k in keys):
            fail(f"{key}.gdpo_reward_keys", keys, "must be a list of key names")
        if weights is not None and (not keys or len(weights) != len(keys)):
            fail(f"{key}.gdpo_reward_weights", weights, "must give one weight per algorithm.gdpo_reward_keys entry")


# ----------------------------------------------------------------------------- trainer
@dataclass
class TrainerConfig:
    total_epochs: int = opt(30, "Passes over the training prompts (total_training_steps wins if set)", rule=_SIZE)
    total_training_steps: int | None = opt(
        200, "PPO steps to run (verl: null = from total_epochs)", rule=at_least(1, or_null=True)
    )
    project_name: str = opt("klguard", "Project name for loggers and the run directory")
    experiment_name: str = opt("arith_demo", "Experiment name for loggers and the run directory")
    logger: list = opt(
        ["console", "jsonl", "tensorboard"], "Trackers, any of: " + choices(
            Logger, jsonl="metrics.jsonl, always written", file="verl's format at $VERL_FILE_LOGGER_PATH")
    )
    save_freq: int = opt(
        10, "Checkpoint every N steps (-1 = only at the end); the guard rolls back to these", rule=_EVERY
    )
    resume_mode: ResumeMode = opt("auto", choices(ResumeMode, auto="latest checkpoint in default_local_dir"))
    resume_from_path: str | None = opt(None, "Checkpoint folder to resume from when resume_mode=resume_path")
    val_before_train: bool = opt(True, "Validate before the first step")
    test_freq: int = opt(10, "Validate every N steps (-1 = only at the end)", rule=_EVERY)
    critic_warmup: int = opt(0, "Steps that train only the critic")
    rollout_data_dir: str | None = opt(
        None, "Write each step's rollouts to <dir>/<step>.jsonl: input, output, gts, score, step, gold (null = off)"
    )
    validation_data_dir: str | None = opt(
        None, "Write each validation's responses to <dir>/<step>.jsonl, as rollout_data_dir (null = off)"
    )
    default_local_dir: str = opt(
        "checkpoints/${trainer.project_name}/${trainer.experiment_name}", "Run directory"
    )
    max_actor_ckpt_to_keep: int | None = opt(
        None, "Keep at most this many checkpoints (null = all)", rule=at_least(1, or_null=True)
    )
    device: Device = opt("auto", f"{choices(Device)} (verl: cuda)")
    seed: int = opt(1, "Seeds every RNG (torch, numpy, python, sampling) so a CPU run is reproducible (ours)")
    progress_bar: bool = opt(True, "Show progress: a live bar on a terminal, plain lines when stderr is not one (ours)")
    progress_every: int = opt(
        0, "Off a terminal, a progress line every N steps (0 = every 10% of the run; ours)",
        rule=Rule(lambda v: v >= 0, "must be >= 0 (0 = every 10%)"),
    )
    report: bool = opt(True, "Write report.html (curves, guard actions) into the run directory at the end (ours)")
    dist_timeout_s: float = opt(
        1800.0, "Seconds a rank waits in a collective before the job fails instead of hanging (torchrun runs; ours)",
        rule=positive,
    )
    debug: bool = opt(
        False, "Check every step that all ranks hold the same KL coefficient, guard state and metrics (ours)"
    )
    max_nonfinite_steps: int = opt(
        3, "Pause after this many steps in a row skipped for a NaN/Inf in rewards, log-probs, KL, loss or grads (ours)",
        rule=Rule(lambda v: v >= 0, "must be >= 0 (0 = never pause)"),
    )

    def check(self, key: str) -> None:
        for name in self.logger:
            one_of(f"{key}.logger", name, Logger)
        if self.resume_mode == "resume_path" and not self.resume_from_path:
            fail(f"{key}.resume_from_path", None, f"must be set when {key}.resume_mode=resume_path")


# ----------------------------------------------------------------------------- profiler
@dataclass
class GlobalProfilerConfig:
    tool: ProfilerTool | None = opt(
        None,
        "Profiler: " + choices(ProfilerTool | None, null="off", torch="torch.profiler traces of global_profiler.steps"),
        invalid="is not supported: klguard writes torch.profiler traces (tool=torch) or none (null)",
    )
    steps: list | None = opt(
        None, "Training steps to profile, 1-based, e.g. [3, 4] (null = none)",
        rule=Rule(lambda v: isinstance(v, list) and all(whole(s, 1) for s in v),
                  "must be a list of training steps >= 1, or null"),
    )
    profile_continuous_steps: bool = opt(False, "Consecutive listed steps share one trace (false: one per step)")
    save_path: str = opt(
        "${trainer.default_local_dir}/profile", "Where traces go, one folder per profiled step (verl: outputs/profile)"
    )

    def check(self, key: str) -> None:
        if self.tool == "torch" and not self.steps:
            fail(f"{key}.steps", self.steps, f"must list the steps to profile when {key}.tool=torch")


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
    controller: CalibrateController = opt(
        "adaptive", f"KL controller each sweep run uses: {choices(CalibrateController)} (target_kl must steer it)"
    )
    horizon: int = opt(
        300, "Adaptive controller horizon for the sweep runs (short runs need a fast controller)", rule=positive
    )
    kl_coef: float = opt(0.05, "Initial kl_coef of every sweep run", rule=positive)
    max_hacking_rate: float = opt(
        0.1, "The recommendation keeps the final hacking rate at or under this", rule=interval("[0, 1]")
    )
    metric: str = opt(
        "val-core/", "Score to maximise: a metric name, or val-core/ = the first validation accuracy (gold on the demo)"
    )
    output_dir: str = opt("calibration", "Where the sweep's runs, calibration.json and report.html go")
    parallel: int | None = opt(
        None, "Sweep runs at once (null = one per two cores, all cores on a 2-core machine)",
        rule=at_least(1, or_null=True),
    )
    early_stop: bool = opt(
        True, "Stop a sweep run once it hacks or falls behind the others (successive halving at every validation)"
    )
    stop_hacking_rate: float = opt(
        0.3, "Early stop: a run whose sampled hacking rate (10-step mean) stays over this; above max_hacking_rate, "
        "since every run hacks a little before its controller acts (0.3: replayed on 2 seeds' full sweeps, checked "
        "on a third: same recommendation as without early stopping)", rule=interval("[0, 1]")
    )
    stop_hacking_validations: int = opt(
        3, "Early stop: validations in a row with the sampled hacking rate over stop_hacking_rate", rule=_SIZE
    )
    stop_behind: float = opt(
        0.2, "Early stop: a run whose score is this far under the best non-hacking run's at the same step",
        rule=positive,
    )
    extend_grid: bool = opt(
        True, "Add targets when the grid has none that learns without hacking (lower when all hack, higher when "
        "none learns, between when both)"
    )
    min_gain: float = opt(
        0.01, "A run learns when its final score beats the step-0 score by more than this", rule=at_least(0.0)
    )
    budget_steps: int | None = opt(
        None, "Most PPO steps the whole sweep trains, grid extension included (null = 2 x len(grid) x total steps)",
        rule=at_least(1, or_null=True),
    )

    def check(self, key: str) -> None:
        if not self.grid:
            fail(f"{key}.grid", self.grid, "must list at least one target_kl")
        for value in self.grid:
            positive.check(f"{key}.grid", value)


# ----------------------------------------------------------------------------- the TRL callback
TRLGoldSource = Literal["train", "eval"]


@dataclass
class TRLConfig:
    gold_reward: str | None = opt(
        None, "KLGuardCallback: a reward function of the GRPOTrainer (weight 0) whose mean is the gold score"
    )
    gold_source: TRLGoldSource = opt("train", "Gold the guard sees: " + choices(
        TRLGoldSource, train="the mean over gold_window training steps", eval="eval_rewards/<gold>/mean"))
    gold_window: int = opt(10, "gold_source=train: training steps averaged into one validation score", rule=_SIZE)


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
    guard: GuardConfig = section(GuardConfig, "The KL guard: rules that watch the run and act (ours)")
    sft: SFTConfig = section(SFTConfig, "Supervised warm start of the built-in policy (ours)")
    calibrate: CalibrateConfig = section(CalibrateConfig, "`klguard calibrate`: the target_kl sweep (ours)")
    trl: TRLConfig = section(TRLConfig, "klguard.integrations.trl.KLGuardCallback in TRL's GRPOTrainer (ours)")
