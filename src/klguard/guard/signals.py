"""Reading the guard's inputs from a step's metrics dict (verl's metric names).

A metric that is absent or not finite counts as "no information this step": rules that need it
neither fire nor advance their streaks.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from fnmatch import fnmatchcase

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

INPUT_METRICS: tuple[str, ...] = (PPO_KL, REF_KL, KL_BATCH_TOKEN_MEAN, REF_KL_LOSS, KL_COEF, KL_LOSS_COEF, KL_SEQ_SUM,
                                  SCORE, SCORE_MIN, SCORE_MAX, GRAD_NORM, GRAD_CLIP, LR, LENGTH, ENTROPY, LENGTH_CORR,
                                  REPETITION, RM_SPREAD, REF_LOW_PROB, REF_NLL, RM_OUTLIER, RM_SCORE, RM_SCORE_STD,
                                  AUDIT_SCORE, AUDIT_SCORE_STD, VAL_METRIC)
"""Every metric the guard reads."""


@dataclass(frozen=True)
class Observation:
    """One step's guard inputs; ``None`` where the metric is missing or not finite."""

    ppo_kl: float | None = None
    kl: float | None = None
    kl_name: str = REF_KL
    kl_coef: float | None = None
    kl_seq_sum: float | None = None
    score: float | None = None
    score_min: float | None = None
    score_max: float | None = None
    grad_norm: float | None = None
    grad_clip: float | None = None
    lr: float | None = None
    length: float | None = None
    entropy: float | None = None
    length_corr: float | None = None
    repetition: float | None = None
    rm_spread: float | None = None
    ref_low_prob: float | None = None
    ref_nll: float | None = None
    rm_outlier: float | None = None
    rm_score: float | None = None
    rm_score_std: float | None = None
    audit_score: float | None = None
    audit_score_std: float | None = None
    val: float | None = None


def _get(metrics: Mapping[str, float], key: str) -> float | None:
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
    return Observation(
        ppo_kl=_get(metrics, PPO_KL), kl=kl, kl_name=kl_name, kl_coef=kl_coef,
        kl_seq_sum=_get(metrics, KL_SEQ_SUM), score=_get(metrics, SCORE), score_min=_get(metrics, SCORE_MIN),
        score_max=_get(metrics, SCORE_MAX), grad_norm=_get(metrics, GRAD_NORM),
        grad_clip=_get(metrics, GRAD_CLIP), lr=_get(metrics, LR), length=_get(metrics, LENGTH),
        entropy=_get(metrics, ENTROPY), length_corr=_get(metrics, LENGTH_CORR), repetition=_get(metrics, REPETITION),
        rm_spread=_get(metrics, RM_SPREAD), ref_low_prob=_get(metrics, REF_LOW_PROB), ref_nll=_get(metrics, REF_NLL),
        rm_outlier=_get(metrics, RM_OUTLIER), rm_score=_get(metrics, RM_SCORE),
        rm_score_std=_get(metrics, RM_SCORE_STD), audit_score=_get(metrics, AUDIT_SCORE),
        audit_score_std=_get(metrics, AUDIT_SCORE_STD),
        val=validation_score(metrics, val_metric),
    )


def penalty_share(obs: Observation) -> float | None:
    """Share of the KL penalty in the reward: ``beta * S / |m|``.

    ``beta`` is ``actor/reward_kl_penalty_coeff``, ``S`` is ``actor/kl_seq_sum`` (the KL summed over
    each response's tokens, averaged over the batch, so ``beta * S`` is the mean penalty a sequence
    pays) and ``m`` is ``critic/score/mean``. ``|m|`` stands in for the mean absolute score; the two
    agree when all scores have one sign, as with the built-in proxy reward. None when an input is
    missing, ``m`` is 0, the share overflows, or the batch's scores have both signs
    (``critic/score/min`` < 0 < ``critic/score/max``, as a reward model's logits do): a score centred near 0 makes
    the share as large as it likes, and the rule then ratcheted beta to its cap on the learned-RM exploit.
    Measured per sequence, not per token, so length hacking (one costly skipped EOS spread over many tokens) still
    shows up in full.
    """
    if obs.kl_coef is None or obs.kl_seq_sum is None or obs.score is None or obs.score == 0:
        return None
    if obs.score_min is not None and obs.score_max is not None and obs.score_min < 0 < obs.score_max:
        return None
    share = obs.kl_coef * obs.kl_seq_sum / abs(obs.score)
    return share if math.isfinite(share) else None


def median(values: list[float]) -> float:
    """Median of a non-empty list (mean of the two middle values for an even count)."""
    ordered = sorted(values)
    mid = len(ordered) // 2
    return ordered[mid] if len(ordered) % 2 else (ordered[mid - 1] + ordered[mid]) / 2
