"""Everything the guard remembers between steps, as one JSON-serialisable record, and its version.

`STATE_VERSION` is the version of every state klguard's guard writes: the guard's own (`GuardState.to_dict`) and
the session's (klguard.guard.session, with its host's), wherever a host keeps it. Version 1 states (each rule's
memory in a field of its own) load into version 2 (a rule's memory under its name in `rules`, a baseline's values
under its name in `baselines`).
"""

from __future__ import annotations

import copy
from dataclasses import asdict, dataclass, field, fields
from typing import Any

from klguard.guard import registry

STATE_VERSION = 2
READABLE_VERSIONS = (1, 2)


def initial_memory() -> dict[str, dict[str, Any]]:
    """Each declared rule's memory as it starts."""
    return {r.name: copy.deepcopy(dict(r.memory)) for r in registry.rules()}


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
    # What a rollback target must show: the KL, validation not falling, the length near its baseline
    last_kl: float | None = None
    best_val: float | None = None
    prev_val: float | None = None
    val_falling: bool = False
    length_recent: list[float] = field(default_factory=list)  # the last stable_length_window lengths
    length_ratio: float | None = None  # their mean over the length's baseline
    # Baselines: each metric's values of its first baseline_window steps (at most that many), from its first step
    baselines: dict[str, list] = field(default_factory=dict)
    baseline_start: dict[str, int] = field(default_factory=dict)
    # Each metric's last robust_window values, where the rules read their median (start_up)
    recent: dict[str, list] = field(default_factory=dict)
    # Each rule's own memory (klguard.guard.registry: its declaration's `memory`)
    rules: dict[str, dict[str, Any]] = field(default_factory=initial_memory)
    # Flags of the latest step, and the step each rule last fired
    alarms: dict[str, bool] = field(default_factory=lambda: dict.fromkeys(registry.names("alarm"), False))
    hack: dict[str, bool] = field(default_factory=lambda: dict.fromkeys(registry.names("signal"), False))
    last_fired: dict[str, int] = field(default_factory=dict)
    last_step: int | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"version": STATE_VERSION, **asdict(self)}

    @classmethod
    def from_dict(cls, state: dict[str, Any]) -> GuardState:
        state = copy.deepcopy(dict(state))  # never aliased with the caller's lists
        version = state.pop("version", STATE_VERSION)
        if version not in READABLE_VERSIONS:
            raise ValueError(f"guard state version {version!r} is not supported (expected {STATE_VERSION})")
        if version == 1:
            state = _from_version_1(state)
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(state) - known)
        if unknown:
            raise ValueError(f"unknown guard state keys: {', '.join(unknown)}")
        out = cls(**{k: v for k, v in state.items() if k != "rules"})
        for name, memory in state.get("rules", {}).items():  # a rule declared since keeps its initial memory
            out.rules[name] = {**out.rules.get(name, {}), **memory}
        out.alarms = {**dict.fromkeys(registry.names("alarm"), False), **out.alarms}
        out.hack = {**dict.fromkeys(registry.names("signal"), False), **out.hack}
        out.last_fired = {str(k): int(v) for k, v in out.last_fired.items()}
        out.baseline_start = {str(k): int(v) for k, v in out.baseline_start.items()}
        return out

    def ready(self, rule: str, step: int, cooldown: int) -> bool:
        """Whether ``rule`` is out of its cooldown at ``step``."""
        last = self.last_fired.get(rule)
        return last is None or step - last >= cooldown

    def fired(self, rule: str, step: int) -> None:
        self.last_fired[rule] = step

    def after_rollback(self, to_step: int) -> None:
        """The state of step `to_step` was restored: clear what would fire again at once (the KL, validation and
        flags, each rule's memory but what it keeps), keep the tightening, the rollback count and the baselines."""
        self.last_kl = self.best_val = self.prev_val = None
        self.val_falling = False
        self.alarms = dict.fromkeys(self.alarms, False)
        self.hack = dict.fromkeys(self.hack, False)
        self.last_fired = {rule: min(last, to_step) for rule, last in self.last_fired.items()}
        for r in registry.rules():
            memory = self.rules.setdefault(r.name, {})
            kept = {k: memory[k] for k in r.keep if k in memory}
            self.rules[r.name] = {**copy.deepcopy(dict(r.memory)), **kept}

    def restart_reference_baselines(self) -> None:
        """Collect the baselines measured against the reference anew (after it was re-anchored): the KL to the new
        reference and the samples' NLL under it are not comparable with the old reference's."""
        for r in registry.rules():
            for name in r.reference_baselines:
                self.baselines.pop(name, None)
                self.baseline_start.pop(name, None)


_V1_MEMORY = {"ppo_kl_streak": ("ppo_kl", "streak"), "slow_streak": ("kl_slow", "streak"),
              "kl_hard_streak": ("kl_hard", "streak"), "nonfinite_streak": ("nonfinite", "streak"),
              "kl_history": ("kl_spike", "history"), "penalty_share": ("penalty_share", "value"),
              "val_drop_streak": ("val_drop", "streak"), "divergence_streak": ("proxy_val_divergence", "streak"),
              "proxy_sum": ("proxy_val_divergence", "proxy_sum"), "proxy_n": ("proxy_val_divergence", "proxy_n"),
              "prev_proxy": ("proxy_val_divergence", "prev_proxy"), "collapse_base": ("length_collapse", "base"),
              "audit_gap": ("audit_gap", "value")}
_V1_BASELINES = ("length", "entropy", "kl_seq", "repetition", "rm_spread", "ref_low", "ref_nll", "rm_outlier",
                 "rm_score", "audit_score")


def _from_version_1(state: dict[str, Any]) -> dict[str, Any]:
    """A version 1 state (a field per rule's memory and per baseline) in version 2's layout."""
    memory: dict[str, dict[str, Any]] = {}
    for old, (rule, key) in _V1_MEMORY.items():
        if old in state:
            memory.setdefault(rule, {})[key] = state.pop(old)
    baselines = {name: state.pop(f"{name}_base") for name in _V1_BASELINES if f"{name}_base" in state}
    return {**state, "rules": memory, "baselines": baselines}


def __getattr__(name: str) -> Any:
    """``ALARMS`` and ``HACK_SIGNALS``: the declared alarms' and signals' names, in their order."""
    if name in ("ALARMS", "HACK_SIGNALS"):
        return registry.names("alarm" if name == "ALARMS" else "signal")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
