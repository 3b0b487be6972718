"""One mapping per trainer from its logged metric names to klguard's (verl's), which the guard reads.

Shared by every integration and by `klguard report` on another trainer's output folder: a metric
name appears here once. klguard's own runs and verl log verl's names already and need no map (trainer None).
"""

from __future__ import annotations

import math
import re
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

OPENRLHF_METRICS: dict[str, str] = {
    "kl": "actor/reward_kl_penalty",  # the in-reward KL (k1 by default), or the KL loss with --algo.kl.use_loss
    "reward": "critic/score/mean",
    "return": "critic/returns/mean",
    "response_length": "response_length/mean",
    "response_clip_ratio": "response_length/clip_ratio",
    "entropy_loss": "actor/entropy",  # the mean token entropy (logged when --actor.entropy_coef is set)
    "actor_grad_norm": "actor/grad_norm",
    "actor_lr": "actor/lr",
    "ppo_kl": "actor/ppo_kl",
    "ppo_clip_ratio": "actor/pg_clipfrac",
    "policy_loss": "actor/pg_loss",
    "critic_loss": "critic/vf_loss",
    "values": "critic/values/mean",
}
"""OpenRLHF's PPO logs (TensorBoard `train/<key>`, one entry per global step; read at OpenRLHF 3c3be62). It does
not log the KL coefficient, so the penalty-share rule has no input there."""

METRIC_MAPS: dict[str, dict[str, str]] = {"trl": TRL_METRICS, "openrlhf": OPENRLHF_METRICS}

_OPENRLHF_EVAL = re.compile(r"^eval/eval_(.+)_pass1$")
_OPENRLHF_ONLY = {"policy_loss", "actor_lr", "actor_grad_norm", "ppo_clip_ratio", "response_length"}


def trainer_of_tensorboard_tags(tags: Mapping[str, float]) -> str | None:
    """Whose TensorBoard tags these are: "openrlhf" or "trl" (both write `train/<key>`), None for verl's and
    klguard's (their metric names as they are)."""
    names = {tag.removeprefix("train/") for tag in tags if tag.startswith("train/")}
    if not names:
        return None
    return "openrlhf" if names & _OPENRLHF_ONLY else "trl"


def from_tensorboard(tags: Mapping[str, float], trainer: str | None) -> dict[str, float]:
    """One step's TensorBoard scalars under klguard's names: `train/<key>` through the trainer's map, OpenRLHF's
    `eval/eval_<source>_pass1` as the validation score `val-core/<source>/acc/mean@1`."""
    if trainer is None:
        return to_klguard_names(tags, None)
    named: dict[str, object] = {}
    for tag, value in tags.items():
        evaluation = _OPENRLHF_EVAL.match(tag) if trainer == "openrlhf" else None
        if evaluation:
            named[f"val-core/{evaluation.group(1)}/acc/mean@1"] = value
        elif tag.startswith("train/"):
            named[tag.removeprefix("train/")] = value
    return to_klguard_names(named, trainer)


def to_klguard_names(logs: Mapping[str, object], trainer: str | None) -> dict[str, float]:
    """The finite numeric entries of ``logs`` under klguard's names (a mapped name replaces the trainer's,
    unmapped names are kept as they are; trainer None: verl's and klguard's names, kept)."""
    mapping = METRIC_MAPS[trainer] if trainer is not None else {}
    out: dict[str, float] = {}
    for key, value in logs.items():
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            continue
        out[mapping.get(key, key)] = float(value)
    return out
