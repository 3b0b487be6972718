"""The metrics the guard reads (verl's names), and reading them from a step's metrics dict.

A metric that is absent or not finite counts as "no information this step": rules that need it
neither fire nor advance their streaks. Each rule declares the metrics it reads (klguard.guard.registry); this module
names the ones several rules, the trainer or the name maps share.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from fnmatch import fnmatchcase
from typing import Any

PPO_KL = "actor/ppo_kl"
REF_KL = "actor/reward_kl_penalty"
REF_KL_LOSS = "actor/kl_loss"
KL_COEF = "actor/reward_kl_penalty_coeff"
KL_LOSS_COEF = "actor/kl_coef"
KL_SEQ_SUM = "actor/kl_seq_sum"
KL_BATCH_TOKEN_MEAN = "actor/kl_batch_token_mean"
KL_UNIT_METRICS = {"token_mean": REF_KL, "seq_sum": KL_SEQ_SUM, "batch_token_mean": KL_BATCH_TOKEN_MEAN}
"""The metric that holds the batch KL in each of ``algorithm.kl_ctrl.kl_unit``'s units."""
SCORE = "critic/score/mean"
SCORE_MIN, SCORE_MAX = "critic/score/min", "critic/score/max"
GRAD_NORM = "actor/grad_norm"
GRAD_CLIP = "actor/grad_clip"
LR = "actor/lr"
PG_LOSS = "actor/pg_loss"
POLICY_RATIO = "actor/policy_ratio"  # the mean importance ratio pi/pi_old of the update's tokens
TRUNCATED = "response_length/clip_ratio"  # the share of responses cut off at the length limit
ZERO_STD = "critic/score/frac_zero_std"  # the share of prompt groups whose responses all scored the same
LENGTH = "response_length/mean"
ENTROPY = "actor/entropy"
LENGTH_CORR = "hacking/length_reward_corr"
REPETITION = "hacking/repeated_ngram_share"
RM_SPREAD = "hacking/rm_ensemble_std"
REF_LOW_PROB = "hacking/ref_low_prob_share"
REF_NLL = "hacking/ref_nll"
RM_OUTLIER = "hacking/rm_feature_outlier_share"
RM_SCORE, RM_SCORE_STD = "hacking/rm_score", "hacking/rm_score_std"
AUDIT_SCORE, AUDIT_SCORE_STD = "hacking/audit_score", "hacking/audit_score_std"
VAL_METRIC = "val-core/*/acc/*"
"""The validation score the guard reads by default (guard.val_metric): the task's accuracy, gold where it has one."""

CORE_INPUTS: tuple[str, ...] = (REF_KL, KL_BATCH_TOKEN_MEAN, REF_KL_LOSS, KL_COEF, KL_LOSS_COEF, LR, LENGTH,
                                VAL_METRIC)
"""What the guard itself reads besides its rules' inputs: the KL and its coefficient (either use), the lr (quoted in
its cuts), the length (rollback targets stay within their baseline) and the validation score."""


def _named(metric: str) -> property:
    return property(lambda self: self.get(metric), doc=f"``{metric}`` (None: missing or not finite)")


@dataclass(frozen=True)
class Observation:
    """One step's guard inputs: any metric by name (``get``: None where it is missing or not finite), the reference
    KL and its coefficient as the KL rules read them, and the validation score."""

    metrics: Mapping[str, Any] = field(default_factory=dict)
    kl: float | None = None
    kl_name: str = REF_KL
    kl_coef: float | None = None
    val: float | None = None

    score = _named(SCORE)
    grad_norm = _named(GRAD_NORM)
    lr = _named(LR)
    length = _named(LENGTH)
    entropy = _named(ENTROPY)

    def get(self, name: str) -> float | None:
        return _get(self.metrics, name)


def _get(metrics: Mapping[str, Any], key: str) -> float | None:
    value = metrics.get(key)
    if value is None or isinstance(value, bool):
        return None
    try:
        value = float(value)
    except (TypeError, ValueError):
        return None
    return value if math.isfinite(value) else None


def validation_score(metrics: Mapping[str, float], pattern: str = VAL_METRIC) -> float | None:
    """Mean of the finite metrics whose names match the glob ``pattern`` (None if none): by default the
    ``val-core/<source>/acc/<stat>`` metrics."""
    values = [_get(metrics, k) for k in metrics if fnmatchcase(k, pattern)]
    found = [v for v in values if v is not None]
    return sum(found) / len(found) if found else None


def read_metrics(metrics: Mapping[str, float], val_metric: str = VAL_METRIC, kl_metric: str = REF_KL) -> Observation:
    """Extract the guard's inputs (the validation score: the mean of the metrics matching ``val_metric``).
    The reference KL is ``kl_metric`` when the step has it, else ``actor/reward_kl_penalty`` (KL in the reward),
    else ``actor/kl_loss`` (KL as a loss), all per-token means; the coefficient is
    ``actor/reward_kl_penalty_coeff``, else (KL as a loss only) ``actor/kl_coef``."""
    kl, kl_name, kl_coef = _get(metrics, kl_metric), kl_metric, _get(metrics, KL_COEF)
    if kl is None:
        kl, kl_name = _get(metrics, REF_KL), REF_KL
    if kl is None:
        kl, kl_name = _get(metrics, REF_KL_LOSS), REF_KL_LOSS
        kl_coef = _get(metrics, KL_LOSS_COEF) if kl_coef is None else kl_coef
    return Observation(metrics, kl=kl, kl_name=kl_name, kl_coef=kl_coef,
                       val=validation_score(metrics, val_metric))


def median(values: list[float]) -> float:
    """Median of a non-empty list (mean of the two middle values for an even count)."""
    ordered = sorted(values)
    mid = len(ordered) // 2
    return ordered[mid] if len(ordered) % 2 else (ordered[mid - 1] + ordered[mid]) / 2


def input_metrics() -> tuple[str, ...]:
    """Every metric the guard reads: its rules' (klguard.guard.registry) and its own."""
    from klguard.guard.registry import rules

    return tuple(dict.fromkeys([*(name for r in rules() for name in r.inputs), *CORE_INPUTS]))


def __getattr__(name: str) -> Any:
    """``INPUT_METRICS``: `input_metrics()` as a constant (read once the rules are declared)."""
    if name == "INPUT_METRICS":
        return input_metrics()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
