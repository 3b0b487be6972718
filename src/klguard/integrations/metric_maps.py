"""One mapping per trainer from its logged metric names to klguard's (verl's), which the guard reads.

Shared by every integration and by `klguard report` on another trainer's output folder: a metric
name appears here once. klguard's own runs and verl log verl's names already and need no map (trainer None). The
guard's names are its rules' (klguard.guard.signals, their declarations in klguard/guard/rules/); which rules a
trainer's map leaves without an input is klguard.guard.inputs.rules_without_input's answer.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Collection, Mapping

from klguard.errors import UserError
from klguard.guard.inputs import KL_TOKEN_MEANS
from klguard.guard.signals import (
    ENTROPY,
    GRAD_NORM,
    KL_COEF,
    KL_LOSS_COEF,
    KL_SEQ_SUM,
    LENGTH,
    LR,
    PG_LOSS,
    PPO_KL,
    REF_KL,
    REF_KL_LOSS,
    REF_NLL,
    SCORE,
)

TRL_METRICS: dict[str, str] = {
    "kl": REF_KL_LOSS,  # TRL's KL is in the loss, a token mean (k3 estimator by default)
    "beta": KL_LOSS_COEF,  # logged by KLGuardCallback: the beta this step's loss used
    "reward": SCORE,  # the weighted sum of the trained reward functions
    "reward_std": "critic/score/std",
    "grad_norm": GRAD_NORM,
    "learning_rate": LR,
    "entropy": ENTROPY,
    "completions/mean_length": LENGTH,
    "completions/max_length": "response_length/max",
    "completions/min_length": "response_length/min",
    "completions/clipped_ratio": "response_length/clip_ratio",
    "clip_ratio/region_mean": "actor/pg_clipfrac",
    "frac_reward_zero_std": "critic/score/frac_zero_std",
}
"""TRL 1.x GRPOTrainer's names. With ``logging_steps`` > 1 a logged value is the mean over the steps since the last
log."""

TRL_EARLY_METRICS: dict[str, str] = {"completion_length": LENGTH}
"""TRL GRPOTrainer's names of early 2025 (before `completions/*`) that 1.x renamed."""

VERL_METRICS: dict[str, str] = {
    "critic/kl": REF_KL,  # verl 2024: the in-reward KL, a token mean
    "critic/kl_coeff": KL_COEF,
    "actor/entropy_loss": ENTROPY,  # verl up to mid 2025: the entropy's token mean, whatever its coefficient
}
"""verl's older names; its 2025 names are the guard's own. Also renamed by pattern (verl_name): validation scores
`test_score/<source>` (2024) as `val-core/<source>/acc/mean@1`, `val-core/<source>/reward/<stat>` as
`val-core/<source>/acc/<stat>` where no `acc` is logged (a 0/1 rule reward is the accuracy), and a value logged in
units of its name, `actor/lr(1e-4)`, as `actor/lr`."""

PLAIN_METRICS: dict[str, str] = {
    **TRL_METRICS, **TRL_EARLY_METRICS,
    "train_reward": SCORE, "reward/mean": SCORE, "rewards/mean": SCORE,
    "train_reward_std": "critic/score/std", "reward/std": "critic/score/std",
    "lr": LR, "optim/lr": LR,
    "completion_tokens": LENGTH, "response_length": LENGTH,
    "policy/entropy": ENTROPY,
}
"""Home-made loops and other trainers (Tinker's cookbook, per-step JSON lines): the plain names TRL uses and their
usual synonyms. `kl` is read as the KL to the reference in the loss (a token mean), as TRL's."""

OPENRLHF_METRICS: dict[str, str] = {
    "kl": REF_KL,  # the in-reward KL (k1 by default), or the KL loss with --algo.kl.use_loss
    "reward": SCORE,
    "return": "critic/returns/mean",
    "response_length": LENGTH,
    "response_clip_ratio": "response_length/clip_ratio",
    "entropy_loss": ENTROPY,  # the mean token entropy (logged when --actor.entropy_coef is set)
    "actor_grad_norm": GRAD_NORM,
    "actor_lr": LR,
    "ppo_kl": PPO_KL,
    "ppo_clip_ratio": "actor/pg_clipfrac",
    "policy_loss": PG_LOSS,
    "critic_loss": "critic/vf_loss",
    "values": "critic/values/mean",
}
"""OpenRLHF's PPO logs (TensorBoard `train/<key>`, one entry per global step; read at OpenRLHF 3c3be62). It does
not log the KL coefficient, so the penalty-share rule has no input there."""

METRIC_MAPS: dict[str, dict[str, str]] = {"trl": TRL_METRICS | TRL_EARLY_METRICS, "openrlhf": OPENRLHF_METRICS,
                                          "verl": VERL_METRICS,
                                          "plain": PLAIN_METRICS}


def _log(value: float) -> float | None:
    """ln(value) for a finite positive value, else None (skipped)."""
    return math.log(value) if math.isfinite(value) and value > 0 else None


TRANSFORMS: dict[str, Callable[[float], float | None]] = {"log": _log}
"""Value transforms by name, for a logged metric that is a function of a guard input (`--map NAME=GUARD_NAME:log`).
A transform's None skips the value: the guard never gets a NaN from one."""

CONVERTED_METRICS: dict[str, dict[str, tuple[str, str]]] = {
    "plain": {"eval_perplexity": (REF_NLL, "log")},
}
"""Per trainer: logged name -> (guard name, transform name in TRANSFORMS). A home-made loop's `eval_perplexity` is
the perplexity of its samples under the frozen base model (IMDB-sentiment GRPO demo logs, every 10 steps): its log is
their mean NLL per token under the reference, `hacking/ref_nll`."""


def split_target(spec: str) -> tuple[str, str | None]:
    """`GUARD_NAME` or `GUARD_NAME:TRANSFORM` as (guard name, transform name or None); UserError for an unknown
    transform."""
    name, sep, transform = spec.rpartition(":")
    if not sep:
        return spec, None
    if not name:
        raise UserError(f"{spec!r}: no guard name before ':'")
    if transform not in TRANSFORMS:
        raise UserError(f"{spec!r}: unknown transform {transform!r} after ':' (known: {', '.join(TRANSFORMS)})")
    return name, transform


def converted(name: str, value: float, trainer: str | None,
              user_map: Mapping[str, str] | None = None) -> tuple[str, float | None] | None:
    """(guard name, transformed value or None to skip) where `user_map` (`--map`) or the trainer's
    CONVERTED_METRICS give `name` a transform; None where neither does."""
    spec = (user_map or {}).get(name)
    if spec is not None:
        target, transform = split_target(spec)
    elif name in CONVERTED_METRICS.get(trainer or "", {}):
        target, transform = CONVERTED_METRICS[trainer][name]
    else:
        return None
    return target, (value if transform is None else TRANSFORMS[transform](value))


_OPENRLHF_EVAL = re.compile(r"^eval/eval_(.+)_pass1$")
_OPENRLHF_ONLY = {"policy_loss", "actor_lr", "actor_grad_norm", "ppo_clip_ratio", "response_length"}


def trainer_of_tensorboard_tags(tags: Mapping[str, float]) -> str | None:
    """Whose TensorBoard tags these are: "openrlhf" or "trl" (both write `train/<key>`), None for verl's and
    klguard's (their metric names as they are)."""
    names = {tag.removeprefix("train/") for tag in tags if tag.startswith("train/")}
    if not names:
        return None
    return "openrlhf" if names & _OPENRLHF_ONLY else "trl"


def tensorboard_names(tags: Mapping[str, float], trainer: str) -> dict[str, float]:
    """TRL's and OpenRLHF's `train/<key>` tags as `<key>` (the trainer's own name, for its map), OpenRLHF's
    `eval/eval_<source>_pass1` as the validation score `val-core/<source>/acc/mean@1`."""
    named: dict[str, float] = {}
    for tag, value in tags.items():
        evaluation = _OPENRLHF_EVAL.match(tag) if trainer == "openrlhf" else None
        if evaluation:
            named[f"val-core/{evaluation.group(1)}/acc/mean@1"] = value
        elif tag.startswith("train/"):
            named[tag.removeprefix("train/")] = value
    return named


def with_kl_per_sequence(metrics: dict[str, float]) -> dict[str, float]:
    """`metrics` with `actor/kl_seq_sum` (what the kl_growth signal reads) where a trainer logs a token-mean KL and the
    mean response length but no KL per sequence (TRL, verl): their product. TRL's and verl's KL is the mean over the
    batch's tokens, so the product is the mean over sequences of each one's summed KL (with gradient accumulation,
    TRL logs the mean of its micro-batches' means: then it is an estimate). A step that logs its own is kept."""
    kl = next((metrics[k] for k in KL_TOKEN_MEANS if k in metrics), None)
    if KL_SEQ_SUM in metrics or kl is None or LENGTH not in metrics:
        return metrics
    return {**metrics, KL_SEQ_SUM: kl * metrics[LENGTH]}


def to_klguard_names(logs: Mapping[str, object], trainer: str | None) -> dict[str, float]:
    """The finite numeric entries of ``logs`` under klguard's names (a mapped name replaces the trainer's,
    unmapped names are kept as they are; trainer None: verl's and klguard's names, kept)."""
    mapping = METRIC_MAPS[trainer] if trainer is not None else {}
    out: dict[str, float] = {}
    for key, value in logs.items():
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            continue
        name, new = converted(key, float(value), trainer) or (mapping.get(key, key), float(value))
        if new is not None:
            out[name] = new
    return with_kl_per_sequence(out)


_VERL_TEST_SCORE = re.compile(r"^test_score/(.+)$")
_VERL_VAL_REWARD = re.compile(r"^val-core/(.+)/reward/([^/]+)$")
_IN_UNITS = re.compile(r"^(.+)\(([0-9.]+(?:e[-+]?\d+)?)\)$")
_VERL_PREFIXES = ("actor/", "critic/", "val-core/", "timing_s/", "timing/", "response_length/")
_TRL_ONLY = ("completions/", "rewards/", "clip_ratio/")


def trainer_of_names(names: Collection[str]) -> str:
    """Whose metric names these are: "verl" (its `actor/`, `critic/` groups), "trl" (`completions/*`,
    `rewards/<fn>/*`, `reward_std`), else "plain" (any other trainer's flat names)."""
    if any(name.startswith(_VERL_PREFIXES) for name in names):
        return "verl"
    if any(name.startswith(_TRL_ONLY) or name in ("reward_std", "completion_length") for name in names):
        return "trl"
    return "plain"


def verl_name(name: str, value: float, logged: Collection[str]) -> tuple[str, float]:
    """verl's older names and patterns as the guard's (VERL_METRICS' note); `logged`: the step's other names."""
    if name in VERL_METRICS:
        return VERL_METRICS[name], value
    match = _VERL_TEST_SCORE.match(name)
    if match:
        return f"val-core/{match.group(1)}/acc/mean@1", value
    match = _VERL_VAL_REWARD.match(name)
    if match and not any(k.startswith(f"val-core/{match.group(1)}/acc/") for k in logged):
        return f"val-core/{match.group(1)}/acc/{match.group(2)}", value
    match = _IN_UNITS.match(name)
    if match:
        return match.group(1), value * float(match.group(2))
    return name, value


def guard_names(raw: Mapping[str, float], trainer: str | None,
                user_map: Mapping[str, str] | None = None) -> dict[str, float]:
    """One step's raw metrics under the guard's names, non-finite values kept (a NaN gradient norm is news).
    `user_map` (`--map name=guard_name[:transform]`) goes first; a trainer's name never replaces a name the step logs
    itself; the other names are kept as they are; a value its transform skips is left out (CONVERTED_METRICS). TRL
    without `reward`: the sum of `rewards/<fn>/mean` is the score."""
    user_map = user_map or {}
    mapping = METRIC_MAPS.get(trainer, {}) if trainer is not None else {}
    out: dict[str, float] = {}
    kept: list[tuple[str, float]] = []
    renamed: list[tuple[str, float]] = []
    for name, value in raw.items():
        change = converted(name, float(value), trainer, user_map)
        if change is None:
            new = verl_name(name, float(value), raw) if trainer == "verl" else (mapping.get(name, name), float(value))
            (kept if new[0] == name else renamed).append(new)
            continue
        target, number = change
        if number is not None:
            if name in user_map:
                out[target] = number
            else:
                renamed.append((target, number))
    for name, value in kept + renamed:
        out.setdefault(name, value)
    if trainer in ("trl", "plain") and SCORE not in out:
        parts = [v for k, v in raw.items() if k.startswith("rewards/") and k.endswith("/mean")]
        if parts:
            out[SCORE] = sum(parts)
    return with_kl_per_sequence(out)
