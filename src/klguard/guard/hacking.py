"""Rule 9: a reward-hacking detector on signals that need no gold score.

Each signal is measured every step and logged as ``guard/hack_<name>``; those named in ``guard.hacking_signals``
raise ``guard/hacking_alarm`` (and the guard's ``hacking_action``). A baseline is the mean of the first
``baseline_window`` steps that reported the metric; no signal fires while its baseline is being collected.

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
  disagree on the policy's responses more than they did on the starting policy's (Eisenstein et al. 2023).
"""

from __future__ import annotations

from dataclasses import dataclass

from klguard.guard.config import GuardConfig
from klguard.guard.signals import ENTROPY, KL_SEQ_SUM, LENGTH, LENGTH_CORR, REPETITION, RM_SPREAD, Observation
from klguard.guard.state import GuardState

_VAL_METRIC = "val-core/*/acc/*"


@dataclass(frozen=True)
class Evidence:
    """One active hacking signal, for the reason and fields of the resulting action."""

    signal: str
    metric: str
    value: float | None
    threshold: float | None
    text: str


def _baseline(values: list[float], new: float | None, size: int) -> float | None:
    """Collect ``new`` into ``values`` until full; return the baseline mean once it is complete."""
    if len(values) < size:
        if new is not None:
            values.append(new)
        return None
    return sum(values) / len(values)


def _length_signals(cfg: GuardConfig, st: GuardState, obs: Observation) -> list[Evidence]:
    length0 = _baseline(st.length_base, obs.length, cfg.baseline_window)
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


def measure_hacking(cfg: GuardConfig, st: GuardState, obs: Observation) -> list[Evidence]:
    """Update every signal; return the evidence of the active signals that raise the alarm."""
    window = cfg.baseline_window
    entropy0 = _baseline(st.entropy_base, obs.entropy, window)
    kl0 = _baseline(st.kl_seq_base, obs.kl_seq_sum, window)
    repeat0 = _baseline(st.repetition_base, obs.repetition, window)
    spread0 = _baseline(st.rm_spread_base, obs.rm_spread, window)
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
    if st.hack["proxy_val_divergence"]:
        evidence.append(Evidence("proxy_val_divergence", _VAL_METRIC, st.prev_val, None,
                                 "validation fell while the proxy score rose"))
    return [e for e in evidence if e.signal in cfg.hacking_signals]


def describe(evidence: list[Evidence]) -> str:
    """One sentence naming every active signal."""
    return "Reward hacking suspected (" + "; ".join(e.text for e in evidence) + ")"
