"""Rule 9: a reward-hacking detector on signals that need no gold score.

Signals (any one raises ``guard/hacking_alarm``):

- ``length_growth``: ``response_length/mean`` above ``(1 + length_growth_max)`` x its baseline, the
  mean over the first ``baseline_window`` steps that reported it;
- ``length_corr``: ``hacking/length_reward_corr`` above ``length_corr_max`` while the length is above
  ``(1 + length_corr_min_growth)`` x its baseline (reward bought with length);
- ``entropy_collapse``: ``actor/entropy`` below ``entropy_collapse_ratio`` x its baseline;
- ``proxy_val_divergence``: at a validation, the validation score fell while the mean training
  (proxy) score since the previous validation rose (set in :func:`rules.measure_validation`).

No signal fires while its baseline is still being collected.
"""

from __future__ import annotations

from dataclasses import dataclass

from klguard.guard.config import GuardConfig
from klguard.guard.signals import ENTROPY, LENGTH, LENGTH_CORR, Observation
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


def measure_hacking(cfg: GuardConfig, st: GuardState, obs: Observation) -> list[Evidence]:
    """Update the per-step signals and return the evidence for every active signal."""
    length0 = _baseline(st.length_base, obs.length, cfg.baseline_window)
    entropy0 = _baseline(st.entropy_base, obs.entropy, cfg.baseline_window)
    evidence: list[Evidence] = []
    length = obs.length
    grow = length0 is not None and length0 > 0 and length is not None
    if length is not None:
        st.length_recent = [*st.length_recent, length][-cfg.stable_length_window:]
    st.length_ratio = sum(st.length_recent) / len(st.length_recent) / length0 if grow else None
    growth_limit = (1 + cfg.length_growth_max) * length0 if grow else None
    st.hack["length_growth"] = growth_limit is not None and length > growth_limit
    if st.hack["length_growth"]:
        evidence.append(Evidence("length_growth", LENGTH, length, growth_limit,
                                 f"response length {length:.3g} is over {growth_limit:.3g}"))
    corr = obs.length_corr
    st.hack["length_corr"] = (grow and corr is not None and corr > cfg.length_corr_max
                              and length > (1 + cfg.length_corr_min_growth) * length0)
    if st.hack["length_corr"]:
        evidence.append(Evidence("length_corr", LENGTH_CORR, corr, cfg.length_corr_max,
                                 f"reward-length correlation {corr:.2f} while length grows"))
    entropy = obs.entropy
    collapse_limit = cfg.entropy_collapse_ratio * entropy0 if entropy0 is not None and entropy0 > 0 else None
    st.hack["entropy_collapse"] = collapse_limit is not None and entropy is not None and entropy < collapse_limit
    if st.hack["entropy_collapse"]:
        evidence.append(Evidence("entropy_collapse", ENTROPY, entropy, collapse_limit,
                                 f"entropy {entropy:.3g} collapsed below {collapse_limit:.3g}"))
    if st.hack["proxy_val_divergence"]:
        evidence.append(Evidence("proxy_val_divergence", _VAL_METRIC, st.prev_val, None,
                                 "validation fell while the proxy score rose"))
    return evidence


def describe(evidence: list[Evidence]) -> str:
    """One sentence naming every active signal."""
    return "Reward hacking suspected (" + "; ".join(e.text for e in evidence) + ")"
