"""Configuration of the KL guard (mounted under ``guard.*`` in klguard's schema).

Every window, patience and cooldown counts calls to :meth:`KLGuard.observe`, i.e. training steps
when the trainer calls it once per step (the trainer may call it once per epoch instead).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields
from typing import Literal, get_args

from klguard.errors import ConfigError
from klguard.fields import Rule, at_least, check_tree, choices, fail, greater, interval, opt
from klguard.guard.signals import VAL_METRIC
from klguard.guard.state import HACK_SIGNALS

HackingAction = Literal["raise_kl_coef", "rollback", "none"]
HACKING_ACTIONS: tuple[str, ...] = get_args(HackingAction)
DEFAULT_HACKING_SIGNALS = ["length_growth", "length_corr", "entropy_collapse", "proxy_val_divergence"]
ROLLBACK_RULES = ("kl_hard", "val_drop", "hacking", "length_collapse")  # the rules that roll back
REANCHOR_RULES = tuple(r for r in ROLLBACK_RULES if r != "kl_hard")  # a policy past the KL limit is no reference

# the rules most fields share
_POSITIVE, _SHARE, _TOLERANCE = greater(0), interval("(0, 1]"), at_least(0)
_FACTOR, _STEPS, _COUNT = at_least(1), at_least(1), at_least(0)


@dataclass
class GuardConfig:
    """Thresholds and responses of the guard's rules. Where a field's help names a measurement, the default was
    calibrated on the built-in demo (docs/guard.md lists the measurements)."""

    enable: bool = opt(True, "Run the KL guard (false: plain verl behaviour, observe() returns no actions)")

    # Rule 1: policy change per update
    ppo_kl_max: float = opt(0.025, "actor/ppo_kl above this: warn and cut the lr", rule=_POSITIVE)
    lr_cut_factor: float = opt(0.5, "Each lr cut multiplies the lr scale by this", rule=_SHARE)
    lr_floor_scale: float = opt(
        0.25, "The lr scale never goes below this share of the lr (bounded tightening: no ratchet)", rule=_SHARE)
    patience: int = opt(5, "Consecutive steps with actor/ppo_kl above the max: pause", rule=_STEPS)

    # Rule 2: share of the KL penalty in the reward
    penalty_share_max: float = opt(
        0.5, "beta*KL per sequence / |mean score| above this: raise kl_coef (a raise lifts the share too)",
        rule=_POSITIVE)
    kl_coef_raise_factor: float = opt(1.5, "kl_coef multiplier of the penalty-share rule", rule=_FACTOR)
    kl_coef_max: float = opt(
        10.0, "A kl_coef raise that would reach this pauses the run instead (no ratchet)", rule=_POSITIVE)

    # Rule 3: gradient norm
    grad_norm_max: float = opt(10.0, "actor/grad_norm above this: tighten grad clipping", rule=_POSITIVE)
    grad_clip_on_alarm: float = opt(1.0, "Gradient clip set when grad_norm alarms", rule=_POSITIVE)

    # Rule 4: validation
    val_metric: str = opt(
        VAL_METRIC, "Glob of the validation metrics the rules read (no gold: val-aux/*/score/*, the RM's own score)",
        rule=Rule(lambda v: bool(v.strip()), "must be a non-empty metric glob"))
    val_drop_max: float = opt(
        0.05, "Relative drop of the validation score from its best (when > 0) that rolls back", rule=_TOLERANCE
    )
    val_fall_tol: float = opt(0.02, "Relative drop between consecutive validations that counts as falling",
                              rule=_TOLERANCE)
    val_patience: int = opt(
        2, "Validations in a row that val_drop or proxy_val_divergence needs before it acts (a score is noisy)",
        rule=_STEPS)

    # Rule 5: KL to the reference, rollbacks
    kl_hard_limit: float = opt(
        0.1, "KL to the reference above this: roll back (healthy early learning on the demo reaches 0.05)",
        rule=_POSITIVE,
    )
    kl_hard_patience: int = opt(
        1, "Consecutive steps with KL above kl_hard_limit before it rolls back (1: the first such step)", rule=_STEPS)
    target_kl_step: float = opt(0.005, "How much a rollback or a KL spike lowers target_kl", rule=_POSITIVE)
    target_kl_min: float = opt(0.002, "The guard never lowers target_kl below this", rule=_POSITIVE)
    rollback_kl_coef_factor: float = opt(6.0, "kl_coef multiplier after a rollback", rule=_FACTOR)
    rollback_lr_factor: float = opt(0.5, "lr scale multiplier after a rollback (1 = keep the lr)", rule=_SHARE)
    max_rollbacks: int = opt(3, "Rollbacks allowed in a run; the next trigger pauses", rule=_COUNT)
    hold_steps: int = opt(
        0, "Calm steps after a rollback that show its tightening held; a trigger sooner pauses (0 = off)",
        rule=_COUNT)
    reanchor_on_rollback: bool = opt(
        True, "After a rollback the reference becomes the restored policy (KL then holds the run near it)"
    )

    reanchor_rollbacks: int = opt(
        1, "Only the first N rollbacks re-anchor the reference (at 3 the demo's reference moves into the leak)",
        rule=_COUNT)
    reanchor_rules: list[str] = opt(
        list(REANCHOR_RULES), "Rollbacks by these rules may re-anchor (not kl_hard: the restored policy had strayed)")

    nonfinite_patience: int = opt(
        0, "Consecutive steps with a NaN/inf grad norm, loss, KL or score: pause (0: off, the trainer skips them)",
        rule=_COUNT)

    # Rule 6: auto-tuning
    spike_factor: float = opt(
        3.0, "KL above this times its running median (and above target_kl) is a spike", rule=_FACTOR
    )
    spike_window: int = opt(20, "Steps in the running median of the KL", rule=_STEPS)
    spike_min_history: int = opt(5, "KL values needed before spikes are detected (<= spike_window)", rule=_STEPS)
    spike_median_floor: float = opt(
        0.1, "Spikes need a running median of at least this share of target_kl (near 0 it is float noise)",
        rule=_TOLERANCE)
    slow_window: int = opt(10, "Consecutive steps with KL above target_kl before kl_coef is raised", rule=_STEPS)
    slow_kl_coef_factor: float = opt(1.2, "kl_coef multiplier when KL stays above target", rule=_FACTOR)
    cooldown: int = opt(10, "Steps between two firings of the same rule", rule=_COUNT)

    # Rule 7: warm-up
    warmup_ratio: float = opt(0.2, "Share of total steps during which kl_coef is frozen", rule=interval("[0, 1]"))
    warmup_kl_coef: float | None = opt(
        None, "kl_coef held during warm-up (null: no freeze; a freeze at 0 makes no measurable difference on the demo)",
        rule=at_least(0, or_null=True),
    )

    # Rule 9: reward-hacking detector (no gold score needed)
    baseline_window: int = opt(10, "First steps averaged into the length/entropy baseline", rule=_STEPS)
    length_growth_max: float = opt(
        0.5, "response_length/mean above (1 + this) x baseline: hacking signal (at 0.75 a run-on minority leaks 0.26)",
        rule=_TOLERANCE
    )
    stable_length_growth: float = opt(
        0.1, "Recent mean length above (1 + this) x baseline: no rollback target (at 0.2 the demo re-anchors to leaks)",
        rule=_TOLERANCE,
    )
    stable_length_window: int = opt(5, "Steps in that recent mean length", rule=_STEPS)
    stable_kl_share: float = opt(
        0.5, "KL to the reference above this share of kl_hard_limit: no rollback target (headroom once restored)",
        rule=interval("(0, 1]"))
    length_corr_max: float = opt(
        1.0, "hacking/length_reward_corr above this while length grows: hacking signal (1 = off)",
        rule=interval("[-1, 1]"),
    )
    length_corr_min_growth: float = opt(
        0.1, "Relative length growth that counts as 'growing' for the correlation signal", rule=_TOLERANCE
    )
    entropy_collapse_ratio: float = opt(0.3, "actor/entropy below this x baseline: hacking signal", rule=_SHARE)
    length_collapse_ratio: float = opt(
        0.0, "response_length/mean below this x the mean of its first baseline_window values: roll back (0: off)",
        rule=interval("[0, 1)"))
    kl_growth_factor: float = opt(
        3.0, "actor/kl_seq_sum above this x baseline (and above kl_growth_min): hacking signal", rule=_FACTOR)
    kl_growth_min: float = opt(1.0, "KL per sequence (nats) the kl_growth signal needs at least", rule=_TOLERANCE)
    repetition_rise: float = opt(
        0.15, "hacking/repeated_ngram_share above baseline + this: hacking signal", rule=_TOLERANCE)
    rm_spread_factor: float = opt(
        2.0, "hacking/rm_ensemble_std (an RM ensemble's spread) above this x baseline: hacking signal", rule=_FACTOR)
    support_prob_floor: float = opt(
        0.01, "Reference probability under which a sampled token is off-support",
        rule=interval("(0, 1)"))
    ref_support_rise: float = opt(
        0.05, "hacking/ref_low_prob_share (off-support tokens) above baseline + this: hacking signal", rule=_TOLERANCE)
    ref_nll_rise: float = opt(
        0.5, "hacking/ref_nll (nats/token under the reference) above baseline + this: hacking signal", rule=_TOLERANCE)
    rm_outlier_quantile: float = opt(
        0.99, "RM-feature outlier: past this quantile of the baseline rollouts' own Mahalanobis distances",
        rule=interval("(0, 1)"))
    rm_outlier_rise: float = opt(
        0.05, "hacking/rm_feature_outlier_share (RM-feature outliers) above baseline + this: hacking signal",
        rule=_TOLERANCE)
    audit_gap_max: float = opt(
        1.0, "Optimised RM's gain minus the audit RM's, in baseline stds, above this: hacking signal", rule=_TOLERANCE)
    hacking_signals: list[str] = opt(
        DEFAULT_HACKING_SIGNALS, "Signals that raise the hacking alarm (the others are only logged as guard/hack_*)")
    hacking_action: HackingAction = opt(
        "rollback", f"Response to a hacking alarm: {choices(HackingAction, rollback='then tighten')}"
    )
    hacking_kl_coef_factor: float = opt(2.0, "kl_coef multiplier on a hacking alarm", rule=_FACTOR)

    def check(self, key: str) -> None:
        """What no single field's rule says: every number finite, the spike history within its window."""
        for f in fields(self):
            value = getattr(self, f.name)
            if isinstance(value, float) and not math.isfinite(value):
                fail(f"{key}.{f.name}", value, "must be finite")
        for name in self.hacking_signals:
            if name not in HACK_SIGNALS:
                fail(f"{key}.hacking_signals", name, f"is not a signal; known: {', '.join(HACK_SIGNALS)}")
        for name in self.reanchor_rules:
            if name not in ROLLBACK_RULES:
                fail(f"{key}.reanchor_rules", name,
                     f"is not a rule that rolls back; known: {', '.join(ROLLBACK_RULES)}")
        if self.spike_min_history > self.spike_window:
            fail(f"{key}.spike_min_history", self.spike_min_history, f"must be <= spike_window ({self.spike_window})")

    def validate(self) -> None:
        """Raise ValueError naming the first invalid field (klguard's config loader raises the same as ConfigError)."""
        try:
            check_tree(self, "guard")
        except ConfigError as exc:
            raise ValueError(str(exc)) from None


EXTERNAL_HOST_DEFAULTS: dict[str, object] = {"kl_hard_limit": 0.5, "kl_hard_patience": 3, "nonfinite_patience": 3,
                                              "entropy_collapse_ratio": 0.05, "length_collapse_ratio": 0.25}
"""The guard's defaults where it watches another trainer's model (the TRL callback, the verl plugin, `klguard watch`
on any log but klguard's own), in place of the built-in task's: ``kl_hard_limit`` 0.1 was set on its 0.35M model.
Measured on 17 public training logs (docs/watch.md, benchmarks/watch_reallogs.py): healthy runs of 0.5B-8B models
reach a per-token KL of 0.35 and a single logged step of 0.94, while the failing ones hold a KL above 0.5 for many
steps (KL blow-up, KL-in-reward collapse, reward hacking); healthy entropy falls to 0.096x its first steps' mean
over hundreds of steps and the mean length to 0.52x, collapsed runs reach 0.011x and 0.05x (one-token answers); a
gradient norm NaN from step 1 is a failure no threshold sees. A user's `guard.*` keys still win."""


def default_target_kl(nnodes: int) -> float:
    """The scale rule: target_kl 0.015 up to 32 nodes (8 GPUs each), 0.01 beyond."""
    if isinstance(nnodes, bool) or not isinstance(nnodes, int) or nnodes < 1:
        raise ValueError(f"nnodes must be an integer >= 1, got {nnodes!r}")
    return 0.015 if nnodes <= 32 else 0.01
