"""verl 0.9.1's policy losses beyond `vanilla`, registered under verl's names.

Each maps (old_logprob, logprob, advantages, response_mask, settings) to a `PolicyLossOutput`, `settings` being the
actor's config. The diagnostics keep one meaning whatever the loss: `ppo_kl` is the mean of `old_logprob - logprob`
over valid tokens (the k1 estimate of KL(old || new), the number `guard.ppo_kl_max` watches); `pg_clipfrac` and
`pg_clipfrac_lower` are shares of valid tokens, each loss saying which, and 0 where it has no such notion.
Token log-ratios go through exp() clamped to [-20, 20] as in `vanilla` (verl leaves clip_cov's, kl_cov's and
geo_mean's unclamped: the numbers agree below e^20); gspo caps its sequence log-ratio at 10, as verl.

verl's `bypass_mode` is not here: it weighs and rejects tokens by importance weights from verl's rollout
correction (`policy_loss.rollout_correction`), which klguard does not implement; klguard's old log-probs come from
the sampling loop itself, so `vanilla` is already the loss against the rollout's own policy.
"""

from __future__ import annotations

import torch
from torch import Tensor

from klguard.algo.loss import PolicyLossOutput, agg_loss, clamped_log_ratio, ppo_token_losses
from klguard.algo.policy_loss_registry import PolicyLossSettings, register_policy_loss
from klguard.algo.stats import masked_count, masked_mean

# GSPO's sequence log-ratio is capped from above only, as verl: a falling ratio only shrinks exp().
_GSPO_LOG_RATIO_CAP = 10.0
# DPPO-KL's binary KL keeps log() finite when a token's probability reaches 1 (verl's epsilon).
_BINARY_KL_EPS = 1e-8


def _clip_bounds(settings: PolicyLossSettings) -> tuple[float, float]:
    """(clip_ratio_low, clip_ratio_high), each defaulting to clip_ratio."""
    low = settings.clip_ratio if settings.clip_ratio_low is None else settings.clip_ratio_low
    high = settings.clip_ratio if settings.clip_ratio_high is None else settings.clip_ratio_high
    return low, high


def _loss_output(pg_loss: Tensor, old_logprob: Tensor, logprob: Tensor, response_mask: Tensor,
                clipped: Tensor | None = None, clipped_lower: Tensor | None = None) -> PolicyLossOutput:
    """The loss with its diagnostics: the shares of valid tokens marked in `clipped` and `clipped_lower` (0 when
    None) and the k1 `ppo_kl`."""
    with torch.no_grad():
        def share(marked: Tensor | None) -> Tensor:
            return pg_loss.new_zeros(()) if marked is None else masked_mean(marked.to(pg_loss.dtype), response_mask)

        ppo_kl = masked_mean(old_logprob - logprob, response_mask)
        return PolicyLossOutput(pg_loss, share(clipped), share(clipped_lower), ppo_kl)


@register_policy_loss("gspo")
def gspo_policy_loss(old_logprob: Tensor, logprob: Tensor, advantages: Tensor, response_mask: Tensor,
                     settings: PolicyLossSettings) -> PolicyLossOutput:
    """GSPO (arXiv 2507.18071): PPO's clip on the sequence ratio exp(mean of the response's token log-ratios).

    Every token of a response carries the sequence ratio's value; its gradient is its own log-prob's, times that
    ratio (sg[s] * pi / sg[pi], as verl). No dual clip. Aggregated by `loss_agg_mode` as verl does; the paper's
    objective is the sequence-level seq-mean-token-mean, which verl's GSPO examples set. pg_clipfrac: tokens whose
    clipped term was chosen; pg_clipfrac_lower: 0.
    """
    low, high = _clip_bounds(settings)
    seq_log_ratio = masked_mean(logprob - old_logprob, response_mask, dim=-1).detach()
    log_ratio = logprob - logprob.detach() + seq_log_ratio.unsqueeze(-1)
    ratio = torch.exp(log_ratio.clamp(max=_GSPO_LOG_RATIO_CAP))
    loss_mat, clipped, _ = ppo_token_losses(ratio, advantages, low, high, use_dual_clip=False)
    pg_loss = agg_loss(loss_mat, response_mask, settings.loss_agg_mode)
    return _loss_output(pg_loss, old_logprob, logprob, response_mask, clipped)


@register_policy_loss("cispo")
def cispo_policy_loss(old_logprob: Tensor, logprob: Tensor, advantages: Tensor, response_mask: Tensor,
                      settings: PolicyLossSettings) -> PolicyLossOutput:
    """CISPO (MiniMax-M1, arXiv 2506.13585): REINFORCE weighted by the truncated, stop-gradient ratio,
    -sg(clip(r, 1 - clip_ratio_low, 1 + clip_ratio_high)) * A * logprob.

    Every token keeps a gradient; the truncation only bounds its weight. The bounds may exceed 1 (a clip_ratio_low
    >= 1 leaves the ratio without a lower bound, as the paper runs it). Aggregated by `loss_agg_mode`.
    pg_clipfrac: tokens whose ratio was truncated; pg_clipfrac_lower: 0.
    """
    low, high = _clip_bounds(settings)
    ratio = torch.exp(clamped_log_ratio(old_logprob, logprob))
    weight = ratio.clamp(1.0 - low, 1.0 + high)
    loss_mat = -weight.detach() * advantages * logprob
    pg_loss = agg_loss(loss_mat, response_mask, settings.loss_agg_mode)
    return _loss_output(pg_loss, old_logprob, logprob, response_mask, ratio != weight)


@register_policy_loss("sapo")
def sapo_policy_loss(old_logprob: Tensor, logprob: Tensor, advantages: Tensor, response_mask: Tensor,
                     settings: PolicyLossSettings) -> PolicyLossOutput:
    """SAPO (arXiv 2511.20347): a smooth gate instead of the clip, -(4 / tau) * sigmoid(tau * (r - 1)) * A.

    tau is `tau_pos` where A > 0 and `tau_neg` elsewhere. At r = 1 the gradient is PPO's; it fades as r leaves 1,
    faster for the larger tau. Always aggregated seq-mean-token-mean, whatever `loss_agg_mode` says, as verl.
    Both clip fractions are 0.
    """
    ratio = torch.exp(clamped_log_ratio(old_logprob, logprob))
    tau = torch.where(advantages > 0, advantages.new_tensor(settings.tau_pos), advantages.new_tensor(settings.tau_neg))
    gate = torch.sigmoid(tau * (ratio - 1.0)) * (4.0 / tau)
    pg_loss = agg_loss(-gate * advantages, response_mask, "seq-mean-token-mean")
    return _loss_output(pg_loss, old_logprob, logprob, response_mask)


@register_policy_loss("gpg")
def gpg_policy_loss(old_logprob: Tensor, logprob: Tensor, advantages: Tensor, response_mask: Tensor,
                    settings: PolicyLossSettings) -> PolicyLossOutput:
    """GPG (Group Policy Gradient): plain policy gradient, -A * logprob, no ratio and no clip; aggregated by
    `loss_agg_mode`. Both clip fractions are 0."""
    pg_loss = agg_loss(-advantages * logprob, response_mask, settings.loss_agg_mode)
    return _loss_output(pg_loss, old_logprob, logprob, response_mask)


@register_policy_loss("dro")
def dro_policy_loss(old_logprob: Tensor, logprob: Tensor, advantages: Tensor, response_mask: Tensor,
                    settings: PolicyLossSettings) -> PolicyLossOutput:
    """DRO (Direct Reward Optimization): -(A * logprob - dro_beta / 2 * (logprob - old_logprob)^2), the policy
    gradient held near the old policy by a quadratic log-ratio penalty; aggregated by `loss_agg_mode`. Both clip
    fractions are 0."""
    beta = settings.policy_loss.dro_beta
    if beta is None or not beta > 0:
        raise ValueError(f"policy_loss.dro_beta must be > 0 for the dro loss, got {beta!r}")
    loss_mat = -(advantages * logprob - 0.5 * beta * (logprob - old_logprob).square())
    pg_loss = agg_loss(loss_mat, response_mask, settings.loss_agg_mode)
    return _loss_output(pg_loss, old_logprob, logprob, response_mask)


@register_policy_loss("geo_mean")
def geo_mean_policy_loss(old_logprob: Tensor, logprob: Tensor, advantages: Tensor, response_mask: Tensor,
                         settings: PolicyLossSettings) -> PolicyLossOutput:
    """GMPO (arXiv 2507.20673): the clipped objective on the geometric mean of a response's token ratios.

    Each token's log-ratio is clipped to [-clip_ratio_low, clip_ratio_high] pessimistically for its advantage's
    sign (the clip applies only where it lowers the objective); the sequence ratio is exp of their mean, the
    sequence advantage the mean of its token advantages, and the loss the mean over responses of -A_seq * r_seq.
    `loss_agg_mode` is not used, as verl; a response without valid tokens is left out of the mean. pg_clipfrac:
    tokens with A > 0 whose log-ratio was outside the clip range; pg_clipfrac_lower: the same with A < 0.
    """
    low, high = _clip_bounds(settings)
    log_ratio = clamped_log_ratio(old_logprob, logprob)
    clamped = log_ratio.clamp(-low, high)
    sign = torch.sign(advantages)
    pessimistic = sign * torch.minimum(sign * log_ratio, sign * clamped)
    seq_ratio = torch.exp(masked_mean(pessimistic, response_mask, dim=-1))
    seq_advantage = masked_mean(advantages, response_mask, dim=-1)
    non_empty = masked_count(advantages, response_mask, dim=-1) > 0
    pg_loss = masked_mean(-seq_advantage * seq_ratio, non_empty)
    outside = log_ratio != clamped
    return _loss_output(pg_loss, old_logprob, logprob, response_mask, outside & (advantages > 0),
                       outside & (advantages < 0))


def _dppo_loss(old_logprob: Tensor, logprob: Tensor, advantages: Tensor, response_mask: Tensor,
               settings: PolicyLossSettings, inside: Tensor) -> PolicyLossOutput:
    """DPPO's loss given its trust region `inside`: -A * sg(min(r, clip_ratio_c)) * logprob on the tokens inside,
    nothing outside. pg_clipfrac: tokens outside; pg_clipfrac_lower: tokens inside whose ratio was truncated."""
    ratio = torch.exp(clamped_log_ratio(old_logprob, logprob))
    truncated = ratio.clamp(max=settings.clip_ratio_c).detach()
    loss_mat = torch.where(inside, -advantages * truncated * logprob, torch.zeros_like(logprob))
    pg_loss = agg_loss(loss_mat, response_mask, settings.loss_agg_mode)
    return _loss_output(pg_loss, old_logprob, logprob, response_mask, ~inside,
                       inside & (ratio > settings.clip_ratio_c))


@register_policy_loss("dppo_tv")
def dppo_tv_policy_loss(old_logprob: Tensor, logprob: Tensor, advantages: Tensor, response_mask: Tensor,
                        settings: PolicyLossSettings) -> PolicyLossOutput:
    """DPPO-Binary-TV (arXiv 2602.04879): the trust region is on the token's probability, not its ratio.

    A token with A > 0 keeps its gradient while p - p_old <= clip_ratio_high, any other while
    p - p_old >= -clip_ratio_low (the clip ratios are total-variation thresholds here); outside, its loss is 0.
    Inside, the loss is -A * sg(min(r, clip_ratio_c)) * logprob (a truncated importance weight instead of the
    dual clip). Aggregated by `loss_agg_mode`; diagnostics as `_dppo_loss`.
    """
    low, high = _clip_bounds(settings)
    with torch.no_grad():
        moved = torch.exp(logprob) - torch.exp(old_logprob)
        inside = torch.where(advantages > 0, moved <= high, moved >= -low)
    return _dppo_loss(old_logprob, logprob, advantages, response_mask, settings, inside)


@register_policy_loss("dppo_kl")
def dppo_kl_policy_loss(old_logprob: Tensor, logprob: Tensor, advantages: Tensor, response_mask: Tensor,
                        settings: PolicyLossSettings) -> PolicyLossOutput:
    """DPPO-Binary-KL (arXiv 2602.04879): `dppo_tv` with the binary KL between the token's old and new
    probability (chosen vs not chosen) as the divergence.

    A token with A > 0 keeps its gradient while that KL <= clip_ratio_high or its probability did not rise, any
    other while the KL <= clip_ratio_low or its probability did not fall. Loss, aggregation and diagnostics as
    `dppo_tv`.
    """
    low, high = _clip_bounds(settings)
    with torch.no_grad():
        p, p_old = torch.exp(logprob), torch.exp(old_logprob)
        binary_kl = p_old * (old_logprob - logprob) + (1.0 - p_old) * torch.log(
            (1.0 - p_old + _BINARY_KL_EPS) / (1.0 - p + _BINARY_KL_EPS))
        inside = torch.where(advantages > 0, (binary_kl <= high) | (p <= p_old), (binary_kl <= low) | (p >= p_old))
    return _dppo_loss(old_logprob, logprob, advantages, response_mask, settings, inside)


# ---------------------------------------------------------------- Clip-Cov and KL-Cov
# ("The Entropy Mechanism of Reinforcement Learning for Reasoning Language Models"): PPO's surrogate with the few
# tokens whose advantage and log-prob covary most singled out, so that the policy's entropy does not collapse. A
# token's covariance term is (A - mean A) * (logprob - mean logprob), the means over the micro-batch's valid tokens.
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
    low, high = _clip_bounds(settings)
    options = settings.policy_loss
    valid = response_mask != 0
    ratio = torch.exp(clamped_log_ratio(old_logprob, logprob))
    loss_mat, clipped, _ = ppo_token_losses(ratio, advantages, low, high, use_dual_clip=False)
    covariance = _covariance(advantages, logprob, valid)
    candidates = valid & ~clipped & (covariance > options.clip_cov_lb) & (covariance < options.clip_cov_ub)
    cut = _pick_at_random(candidates, max(int(options.clip_cov_ratio * int(valid.sum())), 1))
    loss_mat = torch.where(cut, torch.zeros_like(loss_mat), loss_mat)
    pg_loss = agg_loss(loss_mat, response_mask, settings.loss_agg_mode)
    return _loss_output(pg_loss, old_logprob, logprob, response_mask, cut)


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
    return _loss_output(pg_loss, old_logprob, logprob, response_mask, penalised)
