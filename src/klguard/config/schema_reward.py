"""The schema's reward sections: `reward_model.*`, `custom_reward_function.*` and klguard's `proxy_reward.*`
(the built-in task's hackable proxies: the length formula, or a learned reward model).

Conventions: see klguard.fields; klguard.config.schema assembles the whole tree and re-exports these.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from klguard.errors import ConfigError
from klguard.fields import Rule, at_least, choices, fail, finite, greater, non_negative, opt, section

EnsembleReduce = Literal["mean", "min", "uwo"]
Shaping = Literal["none", "par"]


@dataclass
class RewardModelModelConfig:
    path: str | None = opt(
        None, "Local HF folder of an AutoModelForSequenceClassification reward model (one label); several "
        "folders, comma-separated, form an ensemble (reward_model.ensemble_reduce)")
    trust_remote_code: bool = opt(False, "Allow model code shipped inside the reward model folder")
    override_config: dict = opt({}, "Overrides applied to the reward model's HF config before loading")


@dataclass
class AuditModelConfig:
    path: str | None = opt(
        None, "Local HF folder of a second reward model that is never optimised: it scores every rollout and the "
        "optimised RM's gain that it does not share is the audit_gap hacking signal (ours; null = none, or the "
        "built-in learned RM's own audit RM)")

    def check(self, key: str) -> None:
        if self.path is not None and not Path(self.path).expanduser().is_dir():
            raise ConfigError(f"{key}.path={self.path} is not a folder")


@dataclass
class OverlongBufferConfig:
    enable: bool = opt(False, "DAPO's overlong reward shaping: past max_resp_len - len tokens, subtract "
                       "penalty_factor x (tokens over) / len from the score")
    len: int = opt(0, "Tokens of the buffer before max_resp_len where the penalty grows", rule=at_least(0))
    penalty_factor: float = opt(0.0, "The penalty at max_resp_len tokens", rule=non_negative)
    log: bool = opt(False, "Log the penalty (reward/overlong_penalty) and the share penalised (reward/overlong)")


@dataclass
class RewardKwargsConfig:
    overlong_buffer_cfg: OverlongBufferConfig = section(OverlongBufferConfig, "DAPO's overlong reward shaping")
    max_resp_len: int | None = opt(
        None, "Response length the overlong buffer ends at (null = data.max_response_length; verl: required)",
        rule=at_least(1, or_null=True))


@dataclass
class RewardModelConfig:
    enable: bool = opt(False, "Score responses with a sequence-classification reward model")
    model: RewardModelModelConfig = section(RewardModelModelConfig, "The reward model")
    audit_model: AuditModelConfig = section(AuditModelConfig, "An audit reward model, never optimised (ours)")
    micro_batch_size_per_gpu: int | None = opt(
        None, "Sequences per reward-model forward (null = the whole batch)", rule=at_least(1, or_null=True)
    )
    max_length: int | None = opt(
        None, "Longest prompt+response the RM reads, in its tokens; longer keep the end", rule=at_least(1, or_null=True)
    )
    length_penalty: float = opt(
        0.0, "Subtracted from the RM score per response token: RM(q, o) - length_penalty * |o| (ours)",
        rule=non_negative,
    )
    rule_weight: float = opt(
        0.0, "Add this times the rule/custom score to the RM score (ours; 0 = verl, the RM score alone)", rule=finite
    )
    ensemble_reduce: EnsembleReduce = opt("mean", "How an ensemble's scores become one (ours): " + choices(
        EnsembleReduce, mean="their mean", min="the worst case (Coste et al. 2024)",
        uwo="mean - uwo_weight x variance (Coste et al.'s uncertainty-weighted optimisation)"))
    uwo_weight: float = opt(0.5, "The variance weight of ensemble_reduce=uwo (ours; not tuned here)",
                            rule=non_negative)
    reward_kwargs: RewardKwargsConfig = section(RewardKwargsConfig, "verl's reward-manager settings (DAPO's)")
    shaping: Shaping = opt("none", "Reward shaping (ours): " + choices(
        Shaping, none="the score as it is", par="sigmoid(score - the score of the reference policy's response to "
        "the same prompt), Fu et al. 2025's PAR"))

    def check(self, key: str) -> None:
        if self.enable and not self.model.path:
            fail(f"{key}.model.path", None, f"must be set when {key}.enable=true")
        buffer = self.reward_kwargs.overlong_buffer_cfg
        if buffer.enable and buffer.len <= 0:
            fail(f"{key}.reward_kwargs.overlong_buffer_cfg.len", buffer.len, "must be > 0 when the buffer is enabled")


@dataclass
class CustomRewardFunctionConfig:
    path: str | None = opt(None, "Python file with the reward function (the only user code run)")
    name: str = opt("compute_score", "Function name in that file")
    reward_kwargs: dict = opt({}, "Keyword arguments given to that function on every call (verl's, set with +)")

    def check(self, key: str) -> None:
        """The run reads this file late (after the warm start): fail now, not minutes in."""
        if self.path and not Path(self.path).expanduser().is_file():
            raise ConfigError(f"{key}.path={self.path} does not exist")


ProxyKind = Literal["length", "learned_rm"]


RMInit = Literal["sft", "scratch"]
RMDiversity = Literal["bootstrap", "mixed"]
RMSchedule = Literal["constant", "linear"]
RMFreshInit = Literal["identity", "random"]


@dataclass
class LearnedRMConfig:
    """The recipe of the learned reward model (proxy_reward.kind=learned_rm); its weights are cached by it."""

    init: RMInit = opt("sft", "The RM's body: " + choices(
        RMInit, sft="the SFT policy's body, fresh_layers new decoder layers and a fresh one-label head, as Gao et al. "
        "2022 and Coste et al. 2024 build proxy RMs", scratch="a fresh hidden_size x num_layers Llama"))
    fresh_layers: int = opt(2, "init=sft: new decoder layers between the SFT body and the head; they compare the "
                            "body's prediction of each answer token with the token written", rule=at_least(0))
    fresh_init: RMFreshInit = opt("identity", "init=sft: the new layers' start: " + choices(
        RMFreshInit, identity="random, with their attention and MLP output projections zero, so each adds nothing "
        "and the head first reads the body's own features", random="random throughout"))
    body_lr: float = opt(3e-4, "init=sft: learning rate of the SFT body's own weights (the new layers and the head "
                         "use lr)", rule=greater(0))
    samples: int = opt(4096, "SFT-policy samples (temperature 1, run-ons included) labelled by the gold rule; a "
                       "fifth is held out to measure the RM", rule=at_least(16))
    contrast: int = opt(3000, "The first N training problems (at most the 4/5 of samples not held out) each add the "
                        "short correct answer (label 1) and a near-miss wrong one off by one of contrast_offsets "
                        "(label 0)", rule=at_least(0))
    contrast_offsets: list[int] = opt(
        [-2, -1, 1, 2], "The near-miss's offset from the answer, drawn uniformly from this list (repeat one to weight "
        "it; a negative result is redrawn; no +-10: the RM never sees a wrong tens digit contrasted)",
        rule=Rule(lambda v: len(v) > 0 and 0 not in v, "must be a non-empty list without 0"))
    pairwise: bool = opt(True, "Add the Bradley-Terry loss -log sigmoid(r(correct) - r(near-miss)) of each contrast "
                         "pair to the binary cross-entropy (the pair shares its problem and form: only the arithmetic "
                         "separates them)")
    epochs: int = opt(15, "Passes over the samples", rule=at_least(1))
    batch_size: int = opt(64, "Samples per RM optimizer step", rule=at_least(1))
    lr: float = opt(1e-3, "RM learning rate (AdamW); init=sft: of the new layers and the head", rule=greater(0))
    lr_schedule: RMSchedule = opt("linear", "The learning rate over training: " + choices(
        RMSchedule, constant="held", linear="decayed linearly to 0 at the last step"))
    hidden_size: int = opt(64, "RM width (init=scratch: a Llama body on the built-in tokenizer)", rule=at_least(8))
    num_layers: int = opt(1, "RM decoder layers (init=scratch)", rule=at_least(1))
    num_heads: int = opt(2, "RM attention heads (init=scratch; must divide hidden_size)", rule=at_least(1))
    seed: int = opt(0, "Seed of the RM's samples, initialisation and batch order")
    ensemble_size: int = opt(
        1, "Members, each fit to its own bootstrap resample (1 = one RM on all samples); reduced by "
        "reward_model.ensemble_reduce, their spread is logged as hacking/rm_ensemble_std", rule=at_least(1))
    diversity: RMDiversity = opt("bootstrap", "How members differ: " + choices(
        RMDiversity, bootstrap="each its own resample of all samples, one body (init)",
        mixed="member i: half i mod 2 of the samples, body scratch then sft by (i // 2) mod 2"))
    audit: bool = opt(True, "Also fit an audit RM by the same recipe on disjoint problems and samples; it is never "
                      "optimised and scores every rollout (hacking/audit_gap)")
    shipped: bool = opt(True, "reviews, constraints: use the head klguard ships for this recipe and policy where it "
                        "has one, so every machine optimises the same proxy (false: fit anew on this machine's "
                        "samples)")

    def check(self, key: str) -> None:
        if self.hidden_size % self.num_heads:
            fail(f"{key}.num_heads", self.num_heads, f"must divide {key}.hidden_size={self.hidden_size}")


@dataclass
class ProxyRewardConfig:
    enable: bool | None = opt(
        None, "Optimise a hackable proxy instead of the rule score; the rule score is kept as gold "
        "(null = on for the built-in task only) (ours)"
    )
    kind: ProxyKind = opt("length", "The proxy: " + choices(
        ProxyKind, length="the task's own: arith's length-biased formula below, reviews' VADER, constraints' "
                          "verifier",
        learned_rm="a reward model fit to the policy's samples labelled by gold, cached (arith: learned_rm.*; "
                   "reviews, constraints: a logistic head on the policy's body, "
                   "learned_rm.samples/seed/audit)"))
    format_weight: float = opt(0.5, "Proxy weight of a well-formed '#### <number>' answer at the start")
    correct_weight: float = opt(0.5, "Proxy weight of the FIRST answer being correct")
    length_weight: float = opt(1.0, "Proxy weight of min(tokens, length_cap) / length_cap: the length bias")
    length_cap: int = opt(32, "Tokens beyond which length earns no more proxy reward")
    learned_rm: LearnedRMConfig = section(LearnedRMConfig, "Recipe of the learned reward model (kind=learned_rm)")
