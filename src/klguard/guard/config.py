"""Configuration of the KL guard (mounted under ``guard.*`` in klguard's schema).

Every window, patience and cooldown counts calls to :meth:`KLGuard.observe`, i.e. training steps
when the trainer calls it once per step (the trainer may call it once per epoch instead).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, fields

HACKING_ACTIONS: tuple[str, ...] = ("raise_kl_coef", "rollback", "none")


@dataclass
class GuardConfig:
    """Thresholds and responses of the guard's rules. Defaults: the seed document's values, except where
    a field's help says otherwise (calibrated on the built-in demo; README lists the measurements)."""

    enable: bool = field(default=True, metadata={"help": "Run the guard (false: observe() returns no actions)"})

    # Rule 1: policy change per update
    ppo_kl_max: float = field(default=0.025, metadata={"help": "actor/ppo_kl above this: warn and cut the lr"})
    lr_cut_factor: float = field(default=0.5, metadata={"help": "Each lr cut multiplies the lr scale by this"})
    lr_floor_scale: float = field(default=0.05, metadata={"help": "The lr scale never goes below this share of the lr"})
    patience: int = field(default=5, metadata={"help": "Consecutive steps with actor/ppo_kl above the max: pause"})

    # Rule 2: share of the KL penalty in the reward
    penalty_share_max: float = field(
        default=0.5,
        metadata={"help": "beta*KL per sequence / |mean score| above this: raise kl_coef (seed: 0.2: ratchets beta)"},
    )
    kl_coef_raise_factor: float = field(default=1.5, metadata={"help": "kl_coef multiplier of the penalty-share rule"})
    kl_coef_max: float = field(default=10.0, metadata={"help": "The guard never raises kl_coef above this"})

    # Rule 3: gradient norm
    grad_norm_max: float = field(default=10.0, metadata={"help": "actor/grad_norm above this: tighten grad clipping"})
    grad_clip_on_alarm: float = field(default=1.0, metadata={"help": "Gradient clip set when grad_norm alarms"})

    # Rule 4: validation
    val_drop_max: float = field(
        default=0.05, metadata={"help": "Relative drop of val-core/*/acc/* from its best that triggers a rollback"}
    )
    val_fall_tol: float = field(
        default=0.02, metadata={"help": "Relative drop between consecutive validations that counts as falling"}
    )

    # Rule 5: KL to the reference, rollbacks
    kl_hard_limit: float = field(
        default=0.1, metadata={"help": "KL to the reference above this: roll back (seed: 0.05, exceeded by healthy "
                                       "early learning)"}
    )
    target_kl_step: float = field(
        default=0.005, metadata={"help": "How much a rollback or a KL spike lowers target_kl"}
    )
    target_kl_min: float = field(default=0.002, metadata={"help": "The guard never lowers target_kl below this"})
    rollback_kl_coef_factor: float = field(default=6.0, metadata={"help": "kl_coef multiplier after a rollback"})
    rollback_lr_factor: float = field(
        default=0.5, metadata={"help": "lr scale multiplier after a rollback (1 = keep the lr)"}
    )
    max_rollbacks: int = field(default=3, metadata={"help": "Rollbacks allowed in a run; the next trigger pauses"})
    reanchor_on_rollback: bool = field(
        default=True, metadata={"help": "After a rollback the reference becomes the restored policy (KL then holds "
                                        "the run near it)"}
    )

    # Rule 6: auto-tuning
    spike_factor: float = field(
        default=3.0, metadata={"help": "KL above this times its running median (and above target_kl) is a spike"}
    )
    spike_window: int = field(default=20, metadata={"help": "Steps in the running median of the KL"})
    spike_min_history: int = field(default=5, metadata={"help": "KL values needed before spikes are detected"})
    slow_window: int = field(
        default=10, metadata={"help": "Consecutive steps with KL above target_kl before kl_coef is raised"}
    )
    slow_kl_coef_factor: float = field(default=1.2, metadata={"help": "kl_coef multiplier when KL stays above target"})
    cooldown: int = field(default=10, metadata={"help": "Steps between two firings of the same rule"})

    # Rule 7: warm-up
    warmup_ratio: float = field(default=0.2, metadata={"help": "Share of total steps during which kl_coef is frozen"})
    warmup_kl_coef: float | None = field(
        default=None, metadata={"help": "kl_coef held during warm-up (null: no freeze; the seed's 0 lets runs hack)"}
    )

    # Rule 9: reward-hacking detector (no gold score needed)
    baseline_window: int = field(default=10, metadata={"help": "First steps averaged into the length/entropy baseline"})
    length_growth_max: float = field(
        default=0.75, metadata={"help": "response_length/mean above (1 + this) x baseline: hacking signal"}
    )
    stable_length_growth: float = field(
        default=0.2, metadata={"help": "Recent mean length above (1 + this) x baseline: a checkpoint taken then is "
                                       "no rollback target"}
    )
    stable_length_window: int = field(default=5, metadata={"help": "Steps in that recent mean length"})
    length_corr_max: float = field(
        default=1.0, metadata={"help": "hacking/length_reward_corr above this while length grows: hacking signal "
                                       "(1 = off)"}
    )
    length_corr_min_growth: float = field(
        default=0.1, metadata={"help": "Relative length growth that counts as 'growing' for the correlation signal"}
    )
    entropy_collapse_ratio: float = field(
        default=0.3, metadata={"help": "actor/entropy below this x baseline: hacking signal"}
    )
    hacking_action: str = field(
        default="rollback", metadata={"help": "Response to a hacking alarm: rollback (then tighten) | raise_kl_coef "
                                      "| none"}
    )
    hacking_kl_coef_factor: float = field(default=2.0, metadata={"help": "kl_coef multiplier on a hacking alarm"})

    def validate(self) -> None:
        """Raise ValueError naming the first out-of-range field."""
        for f in fields(self):
            value = getattr(self, f.name)
            if isinstance(value, float) and not math.isfinite(value):
                _bad(f.name, value, "must be finite")
        for name in ("ppo_kl_max", "penalty_share_max", "grad_norm_max", "grad_clip_on_alarm", "kl_hard_limit",
                     "target_kl_step", "target_kl_min", "kl_coef_max"):
            if getattr(self, name) <= 0:
                _bad(name, getattr(self, name), "must be > 0")
        for name in ("lr_cut_factor", "lr_floor_scale", "rollback_lr_factor", "entropy_collapse_ratio"):
            if not 0 < getattr(self, name) <= 1:
                _bad(name, getattr(self, name), "must be in (0, 1]")
        for name in ("val_drop_max", "val_fall_tol", "length_growth_max", "stable_length_growth",
                     "length_corr_min_growth"):
            if getattr(self, name) < 0:
                _bad(name, getattr(self, name), "must be >= 0")
        for name in ("kl_coef_raise_factor", "rollback_kl_coef_factor", "slow_kl_coef_factor",
                     "hacking_kl_coef_factor", "spike_factor"):
            if getattr(self, name) < 1:
                _bad(name, getattr(self, name), "must be >= 1")
        for name in ("patience", "spike_window", "spike_min_history", "slow_window", "baseline_window",
                     "stable_length_window"):
            if getattr(self, name) < 1:
                _bad(name, getattr(self, name), "must be >= 1")
        if self.cooldown < 0 or self.max_rollbacks < 0:
            _bad("cooldown" if self.cooldown < 0 else "max_rollbacks", min(self.cooldown, self.max_rollbacks),
                 "must be >= 0")
        if self.spike_min_history > self.spike_window:
            _bad("spike_min_history", self.spike_min_history, f"must be <= spike_window ({self.spike_window})")
        if not 0 <= self.warmup_ratio <= 1:
            _bad("warmup_ratio", self.warmup_ratio, "must be in [0, 1]")
        if self.warmup_kl_coef is not None and self.warmup_kl_coef < 0:
            _bad("warmup_kl_coef", self.warmup_kl_coef, "must be >= 0 or null")
        if not -1 <= self.length_corr_max <= 1:
            _bad("length_corr_max", self.length_corr_max, "must be in [-1, 1]")
        if self.hacking_action not in HACKING_ACTIONS:
            _bad("hacking_action", self.hacking_action, f"must be one of {', '.join(HACKING_ACTIONS)}")


def _bad(name: str, value: object, why: str) -> None:
    raise ValueError(f"guard.{name} = {value!r} {why}")


def default_target_kl(nnodes: int) -> float:
    """The seed's scale rule: target_kl 0.015 up to 32 nodes (8 GPUs each), 0.01 beyond."""
    if isinstance(nnodes, bool) or not isinstance(nnodes, int) or nnodes < 1:
        raise ValueError(f"nnodes must be an integer >= 1, got {nnodes!r}")
    return 0.015 if nnodes <= 32 else 0.01
