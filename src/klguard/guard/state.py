"""Everything the guard remembers between steps, as one JSON-serialisable record."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields
from typing import Any

STATE_VERSION = 1

ALARMS: tuple[str, ...] = ("ppo_kl", "penalty_share", "grad_norm", "val_drop", "kl_hard", "kl_spike", "kl_slow")
"""Rule alarms, reported as ``guard/alarm_<name>``."""

HACK_SIGNALS: tuple[str, ...] = ("length_growth", "length_corr", "entropy_collapse", "proxy_val_divergence",
                                  "kl_growth", "repetition", "rm_spread", "ref_support", "ref_nll", "audit_gap",
                                  "rm_outlier")
"""Reward-hacking signals, each reported as ``guard/hack_<name>``; those in ``guard.hacking_signals`` raise the
hacking alarm."""


@dataclass
class GuardState:
    """Mutable guard state. Lists and dicts only, so ``asdict`` round-trips through JSON exactly."""

    # What the guard believes the trainer is using (its own view, updated from metrics)
    target_kl: float
    kl_coef: float | None = None
    lr_scale: float = 1.0
    grad_clip: float | None = None
    # Rollbacks and warm-up
    rollbacks: int = 0
    calm_since_rollback: int = 0  # guard/stable steps since the last rollback (its tightening held at hold_steps)
    reference_step: int = 0  # the step whose weights the reference holds (0: the initial policy)
    rollback_rule: str | None = None  # the rule that triggered the last rollback
    frozen: bool = False
    resume_kl_coef: float | None = None
    # Windows and streaks
    ppo_kl_streak: int = 0
    slow_streak: int = 0
    kl_hard_streak: int = 0  # consecutive steps with the KL above kl_hard_limit
    nonfinite_streak: int = 0  # consecutive steps with a non-finite guard input
    kl_history: list[float] = field(default_factory=list)
    last_kl: float | None = None
    penalty_share: float | None = None
    # Validation
    best_val: float | None = None
    prev_val: float | None = None
    val_falling: bool = False
    val_drop_streak: int = 0  # consecutive validations more than val_drop_max below the best
    divergence_streak: int = 0  # consecutive validations that fell while the proxy score rose
    # Proxy score (critic/score/mean) averaged between validations
    proxy_sum: float = 0.0
    proxy_n: int = 0
    prev_proxy: float | None = None
    # Hacking-detector baselines: the values of each metric's first baseline_window steps (at most that many)
    baseline_start: dict[str, int] = field(default_factory=dict)  # each baseline's first value's step
    length_base: list[float] = field(default_factory=list)
    length_recent: list[float] = field(default_factory=list)  # the last stable_length_window lengths
    length_ratio: float | None = None  # their mean over the baseline
    entropy_base: list[float] = field(default_factory=list)
    collapse_base: list[float] = field(default_factory=list)  # the first lengths, for length_collapse_ratio
    kl_seq_base: list[float] = field(default_factory=list)
    repetition_base: list[float] = field(default_factory=list)
    rm_spread_base: list[float] = field(default_factory=list)
    ref_low_base: list[float] = field(default_factory=list)
    ref_nll_base: list[float] = field(default_factory=list)
    rm_outlier_base: list[float] = field(default_factory=list)
    rm_score_base: list[list[float]] = field(default_factory=list)  # [mean, std] of the optimised RM's scores
    audit_score_base: list[list[float]] = field(default_factory=list)  # [mean, std] of the audit RM's scores
    audit_gap: float | None = None  # the latest step's gain of the optimised RM not shared by the audit RM
    # Flags of the latest step, and the step each rule last fired
    alarms: dict[str, bool] = field(default_factory=lambda: dict.fromkeys(ALARMS, False))
    hack: dict[str, bool] = field(default_factory=lambda: dict.fromkeys(HACK_SIGNALS, False))
    last_fired: dict[str, int] = field(default_factory=dict)
    last_step: int | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"version": STATE_VERSION, **asdict(self)}

    @classmethod
    def from_dict(cls, state: dict[str, Any]) -> GuardState:
        state = dict(state)
        version = state.pop("version", STATE_VERSION)
        if version != STATE_VERSION:
            raise ValueError(f"guard state version {version!r} is not supported (expected {STATE_VERSION})")
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(state) - known)
        if unknown:
            raise ValueError(f"unknown guard state keys: {', '.join(unknown)}")
        out = cls(**state)
        # Copy the list fields (and the [mean, std] pairs inside them) so the caller's dict is never aliased
        for f in fields(cls):
            value = getattr(out, f.name)
            if isinstance(value, list):
                setattr(out, f.name, [list(v) if isinstance(v, list) else v for v in value])
        out.alarms = {**dict.fromkeys(ALARMS, False), **out.alarms}
        out.hack = {**dict.fromkeys(HACK_SIGNALS, False), **out.hack}
        out.last_fired = {str(k): int(v) for k, v in out.last_fired.items()}
        out.baseline_start = {str(k): int(v) for k, v in out.baseline_start.items()}
        return out

    def ready(self, rule: str, step: int, cooldown: int) -> bool:
        """Whether ``rule`` is out of its cooldown at ``step``."""
        last = self.last_fired.get(rule)
        return last is None or step - last >= cooldown

    def fired(self, rule: str, step: int) -> None:
        self.last_fired[rule] = step
