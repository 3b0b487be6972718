"""verl 0.9.1's Clip-Cov and KL-Cov policy losses ("The Entropy Mechanism of Reinforcement Learning for Reasoning
Language Models"): PPO's surrogate, with the few tokens whose advantage and log-prob covary most singled out so
the policy's entropy does not collapse.

A token's covariance term is (A - mean A) * (logprob - mean logprob), the means over the micro-batch's valid
tokens. Diagnostics as in klguard.algo.policy_losses (`ppo_kl` is the k1 estimate).
"""

from __future__ import annotations

import torch
from torch import Tensor

from klguard.algo.loss import PolicyLossOutput, agg_loss, clamped_log_ratio, ppo_token_losses
from klguard.algo.policy_loss import PolicyLossSettings, register_policy_loss
from klguard.algo.policy_losses import clip_bounds, loss_output
from klguard.algo.stats import masked_mean


def _covariance(advantages: Tensor, logprob: Tensor, valid: Tensor) -> Tensor:
    with torch.no_grad():
        return (advantages - masked_mean(advantages, valid)) * (logprob - masked_mean(logprob, valid))


def _pick_at_random(candidates: Tensor, count: int) -> Tensor:
    """A mask of `count` of the True entries of `candidates` (all of them when fewer), drawn with torch's global
    generator as verl draws them, so a seeded run repeats its draw."""
    where = candidates.nonzero()
    chosen = where[torch.randperm(len(where))[:count].to(where.device)]
    picked = torch.zeros_like(candidates)
    picked[chosen[:, 0], chosen[:, 1]] = True
    return picked


@register_policy_loss("clip_cov")
def clip_cov_policy_loss(old_logprob: Tensor, logprob: Tensor, advantages: Tensor, response_mask: Tensor,
                         settings: PolicyLossSettings) -> PolicyLossOutput:
    """Clip-Cov: PPO's clipped surrogate (no dual clip) with the gradient cut on a few high-covariance tokens.

    Candidates are valid tokens whose clipped term was not chosen and whose covariance term lies strictly between
    policy_loss.clip_cov_lb and clip_cov_ub; max(1, int(clip_cov_ratio * valid tokens)) of them, drawn at random,
    get a loss of 0. Aggregated by `loss_agg_mode`. pg_clipfrac: the share of valid tokens cut, as verl reports
    it; pg_clipfrac_lower: 0.
    """
    low, high = clip_bounds(settings)
    options = settings.policy_loss
    valid = response_mask != 0
    ratio = torch.exp(clamped_log_ratio(old_logprob, logprob))
    loss_mat, clipped, _ = ppo_token_losses(ratio, advantages, low, high, use_dual_clip=False)
    covariance = _covariance(advantages, logprob, valid)
    candidates = valid & ~clipped & (covariance > options.clip_cov_lb) & (covariance < options.clip_cov_ub)
    cut = _pick_at_random(candidates, max(int(options.clip_cov_ratio * int(valid.sum())), 1))
    loss_mat = torch.where(cut, torch.zeros_like(loss_mat), loss_mat)
    pg_loss = agg_loss(loss_mat, response_mask, settings.loss_agg_mode)
    return loss_output(pg_loss, old_logprob, logprob, response_mask, cut)


@register_policy_loss("kl_cov")
def kl_cov_policy_loss(old_logprob: Tensor, logprob: Tensor, advantages: Tensor, response_mask: Tensor,
                       settings: PolicyLossSettings) -> PolicyLossOutput:
    """KL-Cov: the unclipped surrogate -A * r, plus policy_loss.ppo_kl_coef * |logprob - old_logprob| on the
    max(1, int(kl_cov_ratio * valid tokens)) valid tokens of highest covariance term.

    Aggregated by `loss_agg_mode`. pg_clipfrac: the share of valid tokens given the penalty (verl reports none);
    pg_clipfrac_lower: 0. verl's `ppo_kl` for this loss is the mean |log-ratio|; klguard's stays the k1 estimate.
    """
    options = settings.policy_loss
    valid = response_mask != 0
    log_ratio = clamped_log_ratio(old_logprob, logprob)
    loss_mat = -advantages * torch.exp(log_ratio)
    valid_count = int(valid.sum())
    penalised = torch.zeros_like(valid)
    if valid_count:
        covariance = _covariance(advantages, logprob, valid).masked_fill(~valid, -torch.inf)
        top = covariance.flatten().topk(max(1, int(valid_count * options.kl_cov_ratio))).indices
        penalised.view(-1)[top] = True
    loss_mat = torch.where(penalised, loss_mat + options.ppo_kl_coef * log_ratio.abs(), loss_mat)
    pg_loss = agg_loss(loss_mat, response_mask, settings.loss_agg_mode)
    return loss_output(pg_loss, old_logprob, logprob, response_mask, penalised)
