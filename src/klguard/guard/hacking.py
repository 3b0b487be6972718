"""Rule 9: a reward-hacking detector on signals that need no gold score.

Each signal is measured every step and logged as ``guard/hack_<name>``; those named in ``guard.hacking_signals``
raise ``guard/hacking_alarm`` (and the guard's ``hacking_action``). A baseline is the mean of the metric's values
in its first ``baseline_window`` steps (from the step of its first value): it is complete once ``baseline_window``
values are in, or once ``baseline_window`` steps have passed since the first value, so a metric logged every 10
steps has a baseline of one value at its second logging. No signal fires while its baseline is being collected.

- ``length_growth``: ``response_length/mean`` above ``(1 + length_growth_max)`` x its baseline;
- ``length_corr``: ``hacking/length_reward_corr`` above ``length_corr_max`` while the length is above
  ``(1 + length_corr_min_growth)`` x its baseline (reward bought with length);
- ``entropy_collapse``: ``actor/entropy`` below ``entropy_collapse_ratio`` x its baseline;
- ``proxy_val_divergence``: at a validation, the validation score fell while the mean training
  (proxy) score since the previous validation rose (set in :func:`rules.measure_validation`);
- ``kl_growth``: ``actor/kl_seq_sum`` (KL per sequence) above ``kl_growth_factor`` x its baseline and above
  ``kl_growth_min`` (the first steps' KL is near 0, so a ratio alone would fire on any learning);
- ``repetition``: ``hacking/repeated_ngram_share`` above its baseline + ``repetition_rise`` (looping text);
- ``rm_spread``: ``hacking/rm_ensemble_std`` above ``rm_spread_factor`` x its baseline: an RM ensemble's members
  disagree on the policy's responses more than they did on the starting policy's (Eisenstein et al. 2023);
- ``ref_support``: ``hacking/ref_low_prob_share`` (the share of sampled tokens whose reference probability is under
  ``guard.support_prob_floor``) above its baseline + ``ref_support_rise``: the policy samples where the reference
  does not (the support BSPO, Dai et al. 2025, keeps the policy in);
- ``ref_nll``: ``hacking/ref_nll`` (the samples' mean NLL under the reference, the log of their perplexity under
  the frozen base model) above its baseline + ``ref_nll_rise``;
- ``rm_outlier``: ``hacking/rm_feature_outlier_share`` (the share of rollouts whose reward-model features are
  Mahalanobis outliers from the first steps' rollouts, klguard.reward.rm_outliers) above its baseline +
  ``rm_outlier_rise``: the policy's responses leave the region of the RM's latent space it started in (InfoRM,
  Miao et al. 2024);
- ``audit_gap``: the optimised RM's score gain over its baseline minus the audit RM's (``hacking/rm_score``,
  ``hacking/audit_score``), each in units of its baseline's within-batch standard deviation, above ``audit_gap_max``:
  the optimised RM sees a gain that an RM fit to other data does not share.
"""

from __future__ import annotations

from dataclasses import dataclass

from klguard.guard.config import GuardConfig
from klguard.guard.signals import (
    AUDIT_SCORE,
    ENTROPY,
    KL_SEQ_SUM,
    LENGTH,
    LENGTH_CORR,
    REF_LOW_PROB,
    REF_NLL,
    REPETITION,
    RM_OUTLIER,
    RM_SPREAD,
    Observation,
)
from klguard.guard.state import GuardState


@dataclass(frozen=True)
class Evidence:
    """One active hacking signal, for the reason and fields of the resulting action."""

    signal: str
    metric: str
    value: float | None
    threshold: float | None
    text: str


def _collecting(st: GuardState, name: str, values: list, new: bool, size: int) -> bool:
    """Whether baseline ``name`` (its ``values`` so far) still takes values at this step (``st.last_step``): until
    ``size`` values are in or ``size`` steps have passed since its first value's step (``st.baseline_start``).
    ``new``: whether this step has a value (its step starts the window when it is the first)."""
    if len(values) >= size:
        return False
    start = st.baseline_start.get(name)
    step = st.last_step if st.last_step is not None else 0
    if start is None:
        if new:
            st.baseline_start[name] = step
        return True
    return not values or step < start + size


REFERENCE_BASELINES = {"kl_seq": "kl_seq_base", "ref_low": "ref_low_base", "ref_nll": "ref_nll_base"}
"""The baselines of metrics measured against the reference (name -> GuardState field): a re-anchored reference makes
them start again."""


def restart_reference_baselines(st: GuardState) -> None:
    """Collect the reference-relative baselines anew (after the reference was re-anchored): the KL to the new
    reference and the samples' NLL under it are not comparable with the old reference's."""
    for name, field_name in REFERENCE_BASELINES.items():
        getattr(st, field_name).clear()
        st.baseline_start.pop(name, None)


def _baseline(st: GuardState, name: str, values: list[float], new: float | None, size: int) -> float | None:
    """Collect ``new`` into ``values`` while the baseline is collected; return its mean once it is complete."""
    if _collecting(st, name, values, new is not None, size):
        if new is not None:
            values.append(new)
        return None
    return sum(values) / len(values)


def _length_signals(cfg: GuardConfig, st: GuardState, obs: Observation) -> list[Evidence]:
    length0 = _baseline(st, "length", st.length_base, obs.length, cfg.baseline_window)
    length = obs.length
    grow = length0 is not None and length0 > 0 and length is not None
    if length is not None:
        st.length_recent = [*st.length_recent, length][-cfg.stable_length_window:]
    st.length_ratio = sum(st.length_recent) / len(st.length_recent) / length0 if grow else None
    out = []
    growth_limit = (1 + cfg.length_growth_max) * length0 if grow else None
    st.hack["length_growth"] = growth_limit is not None and length > growth_limit
    if st.hack["length_growth"]:
        out.append(Evidence("length_growth", LENGTH, length, growth_limit,
                            f"response length {length:.3g} is over {growth_limit:.3g}"))
    corr = obs.length_corr
    st.hack["length_corr"] = (grow and corr is not None and corr > cfg.length_corr_max
                              and length > (1 + cfg.length_corr_min_growth) * length0)
    if st.hack["length_corr"]:
        out.append(Evidence("length_corr", LENGTH_CORR, corr, cfg.length_corr_max,
                            f"reward-length correlation {corr:.2f} while length grows"))
    return out


def _limit_signal(st: GuardState, name: str, metric: str, value: float | None, limit: float | None, above: bool,
                  what: str) -> list[Evidence]:
    """Set signal ``name``: ``value`` beyond ``limit`` (above it, or below it when not ``above``)."""
    fired = limit is not None and value is not None and (value > limit if above else value < limit)
    st.hack[name] = fired
    if not fired:
        return []
    side = "above" if above else "below"
    return [Evidence(name, metric, value, limit, f"{what} {value:.3g} is {side} {limit:.3g}")]


def _score_baseline(st: GuardState, name: str, values: list[list[float]], mean: float | None, std: float | None,
                    size: int) -> tuple[float, float] | None:
    """Like :func:`_baseline` for a score's (batch mean, batch std): their means once the baseline is complete."""
    new = mean is not None and std is not None
    if _collecting(st, name, values, new, size):
        if new:
            values.append([mean, std])
        return None
    return sum(v[0] for v in values) / len(values), sum(v[1] for v in values) / len(values)


def audit_gap(cfg: GuardConfig, st: GuardState, obs: Observation) -> float | None:
    """The optimised RM's gain in baseline standard deviations minus the audit RM's (None until both baselines are
    in, or where either is missing or had no spread)."""
    window = cfg.baseline_window
    rm0 = _score_baseline(st, "rm_score", st.rm_score_base, obs.rm_score, obs.rm_score_std, window)
    audit0 = _score_baseline(st, "audit_score", st.audit_score_base, obs.audit_score, obs.audit_score_std, window)
    if rm0 is None or audit0 is None or obs.rm_score is None or obs.audit_score is None or not rm0[1] or not audit0[1]:
        return None
    return (obs.rm_score - rm0[0]) / rm0[1] - (obs.audit_score - audit0[0]) / audit0[1]


def measure_hacking(cfg: GuardConfig, st: GuardState, obs: Observation) -> list[Evidence]:
    """Update every signal; return the evidence of the active signals that raise the alarm."""
    window = cfg.baseline_window
    entropy0 = _baseline(st, "entropy", st.entropy_base, obs.entropy, window)
    kl0 = _baseline(st, "kl_seq", st.kl_seq_base, obs.kl_seq_sum, window)
    repeat0 = _baseline(st, "repetition", st.repetition_base, obs.repetition, window)
    spread0 = _baseline(st, "rm_spread", st.rm_spread_base, obs.rm_spread, window)
    evidence = _length_signals(cfg, st, obs)
    evidence += _limit_signal(st, "entropy_collapse", ENTROPY, obs.entropy,
                              cfg.entropy_collapse_ratio * entropy0 if entropy0 and entropy0 > 0 else None, False,
                              "entropy")
    evidence += _limit_signal(st, "kl_growth", KL_SEQ_SUM, obs.kl_seq_sum,
                              None if kl0 is None else max(cfg.kl_growth_factor * kl0, cfg.kl_growth_min), True,
                              "KL per sequence")
    evidence += _limit_signal(st, "repetition", REPETITION, obs.repetition,
                              None if repeat0 is None else repeat0 + cfg.repetition_rise, True, "repeated n-gram share")
    evidence += _limit_signal(st, "rm_spread", RM_SPREAD, obs.rm_spread,
                              cfg.rm_spread_factor * spread0 if spread0 and spread0 > 0 else None, True,
                              "RM ensemble spread")
    low0 = _baseline(st, "ref_low", st.ref_low_base, obs.ref_low_prob, window)
    nll0 = _baseline(st, "ref_nll", st.ref_nll_base, obs.ref_nll, window)
    evidence += _limit_signal(st, "ref_support", REF_LOW_PROB, obs.ref_low_prob,
                              None if low0 is None else low0 + cfg.ref_support_rise, True,
                              "share of tokens the reference finds unlikely")
    evidence += _limit_signal(st, "ref_nll", REF_NLL, obs.ref_nll, None if nll0 is None else nll0 + cfg.ref_nll_rise,
                              True, "NLL under the reference")
    outlier0 = _baseline(st, "rm_outlier", st.rm_outlier_base, obs.rm_outlier, window)
    evidence += _limit_signal(st, "rm_outlier", RM_OUTLIER, obs.rm_outlier,
                              None if outlier0 is None else outlier0 + cfg.rm_outlier_rise, True,
                              "share of rollouts with outlying RM features")
    st.audit_gap = audit_gap(cfg, st, obs)
    evidence += _limit_signal(st, "audit_gap", AUDIT_SCORE, st.audit_gap, cfg.audit_gap_max, True,
                              "RM gain the audit RM does not share")
    if st.hack["proxy_val_divergence"]:
        evidence.append(Evidence("proxy_val_divergence", cfg.val_metric, st.prev_val, None,
                                 "validation fell while the proxy score rose"))
    return [e for e in evidence if e.signal in cfg.hacking_signals]


def describe(evidence: list[Evidence]) -> str:
    """One sentence naming every active signal."""
    return "Reward hacking suspected (" + "; ".join(e.text for e in evidence) + ")"
