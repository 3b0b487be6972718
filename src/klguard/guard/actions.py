"""The guard's output: plain, frozen, JSON-serialisable action records.

The trainer applies a step's actions in list order. A ``rollback`` is always first in its list
and is followed only by the tightening that goes with it (apply that *after* restoring, since the
restored state holds the old values); a ``pause`` is always last.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

ACTION_KINDS: dict[str, str] = {
    "warn": "Log only. old/new: null.",
    "cut_lr": "Scale the actor lr. old/new: the lr scale before/after, a multiplier of the configured "
    "(scheduled) lr in [lr_floor_scale, 1]; apply lr = scheduled_lr * new.",
    "raise_kl_coef": "Set the KL coefficient beta. old: the beta the guard believes is in use; new: the "
    "absolute beta to set (the controller continues from it).",
    "lower_target_kl": "Set the KL controller's target. old/new: absolute target_kl before/after.",
    "set_grad_clip": "Set the actor's gradient clipping. old: the clip in use (<= 0: off, null: unknown); "
    "new: the absolute clip to set.",
    "rollback": "Restore the most recent stable checkpoint, then call guard.on_rollback(step). "
    "old/new: the number of rollbacks before/after this one.",
    "reanchor_reference": "Copy the policy just restored by a rollback into the reference, so the KL "
    "penalty holds the run near that validated checkpoint. old/new: the step of the reference's weights "
    "before/after (0: the initial policy).",
    "pause": "Save a checkpoint and stop cleanly. old/new: null.",
    "freeze_kl_coef": "Hold beta fixed (no controller updates) during warm-up. old: beta in use "
    "(null if unknown); new: the beta to hold.",
    "release_kl_coef": "End the warm-up freeze. old: the held beta; new: the beta the controller resumes "
    "from (null: keep the controller's own value).",
}
"""The closed set of action kinds, each with the meaning of its ``old``/``new`` fields."""


@dataclass(frozen=True)
class Action:
    """One thing the guard asks the trainer to do after step ``step``.

    ``metric``/``value``/``threshold`` name the signal that fired, its value and the limit it
    crossed (null when not applicable); ``rule`` names the guard rule (cooldowns are per rule).
    """

    kind: str
    reason: str
    metric: str | None
    value: float | None
    threshold: float | None
    old: float | None
    new: float | None
    step: int
    rule: str = ""

    def __post_init__(self) -> None:
        if self.kind not in ACTION_KINDS:
            raise ValueError(f"unknown action kind {self.kind!r}; valid: {', '.join(ACTION_KINDS)}")

    def to_dict(self) -> dict[str, Any]:
        """A plain dict for ``events.jsonl`` (same as ``dataclasses.asdict``)."""
        return asdict(self)
