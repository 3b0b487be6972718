"""One mapping per trainer from its logged metric names to klguard's (verl's), which the guard reads.

Shared by every integration and by `klguard report` on another trainer's output folder: a metric
name appears here once. klguard's own runs and verl log verl's names already and need no map.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

TRL_METRICS: dict[str, str] = {
    "kl": "actor/kl_loss",  # TRL's KL is in the loss, a token mean (k3 estimator by default)
    "beta": "actor/kl_coef",  # logged by KLGuardCallback: the beta this step's loss used
    "reward": "critic/score/mean",  # the weighted sum of the trained reward functions
    "reward_std": "critic/score/std",
    "grad_norm": "actor/grad_norm",
    "learning_rate": "actor/lr",
    "entropy": "actor/entropy",
    "completions/mean_length": "response_length/mean",
    "completions/max_length": "response_length/max",
    "completions/min_length": "response_length/min",
    "completions/clipped_ratio": "response_length/clip_ratio",
    "clip_ratio/region_mean": "actor/pg_clipfrac",
}
"""TRL 1.x GRPOTrainer's names (``logging_steps=1``: one step's values, not a window's mean)."""

METRIC_MAPS: dict[str, dict[str, str]] = {"trl": TRL_METRICS}


def to_klguard_names(logs: Mapping[str, object], trainer: str) -> dict[str, float]:
    """The finite numeric entries of ``logs`` under klguard's names (a mapped name replaces the trainer's,
    unmapped names are kept as they are)."""
    mapping = METRIC_MAPS[trainer]
    out: dict[str, float] = {}
    for key, value in logs.items():
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            continue
        out[mapping.get(key, key)] = float(value)
    return out
