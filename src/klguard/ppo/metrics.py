"""Step and validation metrics with verl's names, plus our `hacking/*` family.

Gold-free signals of hacking, logged on every run under the names the guard's signals read (klguard.guard.signals,
each signal's declaration in klguard/guard/rules/): `hacking/repeated_ngram_share` (looping text); with a reference
policy, `hacking/ref_low_prob_share` and `hacking/ref_nll` (how far the samples are from the reference's support);
with a reward model, `hacking/rm_score` (and `_std`), with an audit RM `hacking/audit_score` (and `_std`), and with
an RM ensemble `hacking/rm_ensemble_std` (the members' disagreement). The trainer adds, with a reward model,
`hacking/rm_feature_outlier_share` (klguard.reward.rm_outliers).

For the guard's advice rules, as TRL and verl log them: `critic/score/frac_zero_std` (the share of prompt groups
whose responses all scored alike, with rollout.n > 1), `critic/score/<key>/mean` for each number a custom reward
function returns beside its score (per-function rewards), and, from the update, `actor/policy_ratio`.

Hacking rate: the share of responses that gold says are wrong (gold score 0) while the proxy scores
them at least as high as the short correct answer to the same prompt would score.
"""

from __future__ import annotations

import math
from collections import defaultdict

import torch
from torch import Tensor

from klguard.algo.reward_shaping import informative_groups
from klguard.algo.stats import masked_mean
from klguard.guard.signals import (
    AUDIT_SCORE,
    AUDIT_SCORE_STD,
    LENGTH_CORR,
    REF_LOW_PROB,
    REF_NLL,
    REPETITION,
    RM_SCORE,
    RM_SCORE_STD,
    RM_SPREAD,
    ZERO_STD,
)


def _stats(name: str, x: Tensor, mask: Tensor | None = None) -> dict[str, float]:
    if mask is not None:
        valid = x[mask.bool()]
        mean = masked_mean(x, mask).item()
    else:
        valid, mean = x, x.float().mean().item()
    if valid.numel() == 0:
        return {f"{name}/mean": mean}
    return {f"{name}/mean": mean, f"{name}/max": valid.max().item(), f"{name}/min": valid.min().item()}


def rollout_metrics(out, reward, token_scores: Tensor, token_rewards: Tensor, advantages: Tensor, returns: Tensor,
                    values: Tensor | None, mask: Tensor, group_index: Tensor) -> dict[str, float]:
    lengths = out.response_lengths.float()
    max_len = mask.shape[1]
    metrics = {
        **_stats("critic/score", token_scores.sum(-1)),
        **_stats("critic/rewards", token_rewards.sum(-1)),
        **_stats("critic/advantages", advantages, mask),
        **_stats("critic/returns", returns, mask),
        **_stats("response_length", lengths),
        "response_length/clip_ratio": (lengths >= max_len).float().mean().item(),
        **_stats("prompt_length", out.prompt_mask.sum(-1).float()),
    }
    if values is not None:
        metrics |= _stats("critic/values", values, mask)
    metrics[REPETITION] = repeated_ngram_share(out.response_ids, out.response_mask)
    metrics |= group_metrics(token_scores.sum(-1), group_index)
    for key, numbers in (reward.extra or {}).items():
        metrics[f"critic/score/{key}/mean"] = numbers.float().mean().item()
    if reward.spread is not None:
        metrics[RM_SPREAD] = reward.spread.float().mean().item()
    for (name, std), scores in (((RM_SCORE, RM_SCORE_STD), reward.rm_scores), ((AUDIT_SCORE, AUDIT_SCORE_STD),
                                                                               reward.audit)):
        if scores is not None:
            metrics |= {name: scores.float().mean().item(), std: scores.float().std(correction=0).item()}
    if reward.gold is not None:
        gold, proxy = reward.gold.float(), reward.scores.float()
        metrics |= {
            "hacking/gold_score": gold.mean().item(),
            "hacking/proxy_score": proxy.mean().item(),
            "hacking/gap": (proxy - gold).mean().item(),
            "hacking/rate": reward.hacked.float().mean().item(),
            LENGTH_CORR: _corr(lengths, proxy),
        }
    return metrics


def group_metrics(scores: Tensor, group_index: Tensor) -> dict[str, float]:
    """`critic/score/frac_zero_std`: the share of prompt groups (of two or more responses) whose scores are all
    equal, so a group-relative advantage is 0 for every member; nothing where no group has two members."""
    groups = group_index.bincount()
    if groups.numel() == 0 or int(groups.max()) < 2:
        return {}
    flat = ~informative_groups(scores.cpu(), group_index.cpu())
    return {ZERO_STD: flat[groups > 1].float().mean().item()}


def support_metrics(ref_logprobs: Tensor, mask: Tensor, prob_floor: float) -> dict[str, float]:
    """How far the sampled tokens are from the reference policy's support: the share of them whose reference
    probability is below `prob_floor`, and their mean negative log-likelihood under the reference (nats per token;
    its exp is the samples' perplexity under the frozen base model)."""
    mask = mask.float()
    low = (ref_logprobs.float() < math.log(prob_floor)).float()
    return {REF_LOW_PROB: masked_mean(low, mask).item(), REF_NLL: -masked_mean(ref_logprobs.float(), mask).item()}


REPEAT_N = 3


def repeated_ngram_share(ids: Tensor, mask: Tensor, n: int = REPEAT_N) -> float:
    """Mean over responses of the share of a response's token n-grams that repeat an earlier one of the same
    response (0 for a response shorter than n + 1 tokens): degenerate, looping text scores near 1."""
    shares = []
    for row, valid in zip(ids.tolist(), mask.sum(-1).tolist(), strict=True):
        grams = [tuple(row[i : i + n]) for i in range(int(valid) - n + 1)]
        shares.append(1 - len(set(grams)) / len(grams) if grams else 0.0)
    return sum(shares) / len(shares) if shares else 0.0


def _corr(x: Tensor, y: Tensor) -> float:
    """Pearson correlation, 0 when either side is constant."""
    x, y = x.float() - x.float().mean(), y.float() - y.float().mean()
    denom = (x.square().sum() * y.square().sum()).sqrt()
    return 0.0 if denom == 0 else float((x * y).sum() / denom)


def validation_metrics(results: list, n: int) -> dict[str, float]:
    """`val-core/<data_source>/acc/mean@n` is the gold score where one exists, else the score."""
    by_source: dict[str, dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
    lengths: list[float] = []
    for rows, out, reward in results:
        lengths += out.response_lengths.float().tolist()
        gold = reward.gold if reward.gold is not None else reward.scores
        for i, row in enumerate(rows):
            entry = by_source[row.data_source]
            entry["acc"].append(float(gold[i]))
            entry["score"].append(float(reward.scores[i]))
            if reward.hacked is not None:
                entry["hacking_rate"].append(float(reward.hacked[i]))
    metrics: dict[str, float] = {"val-aux/response_length/mean": sum(lengths) / max(1, len(lengths))}
    for source, entry in by_source.items():
        metrics[f"val-core/{source}/acc/mean@{n}"] = float(torch.tensor(entry["acc"]).mean())
        for key in ("score", "hacking_rate"):
            if entry[key]:
                metrics[f"val-aux/{source}/{key}/mean@{n}"] = float(torch.tensor(entry[key]).mean())
    return metrics
