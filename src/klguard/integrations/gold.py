"""A gold score from a trainer that has no validation: the mean of a per-step score over a window."""

from __future__ import annotations

import math
from typing import Any


class GoldWindow:
    """Collects one finite gold value per training step; every ``size`` values it returns their mean, which
    the guard takes as that step's validation score (a single batch's gold is too noisy for the
    validation-drop rule, which compares each score with the best so far)."""

    def __init__(self, size: int) -> None:
        if size < 1:
            raise ValueError(f"gold window size must be >= 1, got {size}")
        self.size = size
        self.values: list[float] = []

    def add(self, value: float | None) -> float | None:
        """Take one step's gold (None or NaN: skipped); the window's mean when it is full, else None."""
        if value is None or not math.isfinite(value):
            return None
        self.values.append(float(value))
        if len(self.values) < self.size:
            return None
        mean = sum(self.values) / len(self.values)
        self.values = []
        return mean

    def state_dict(self) -> dict[str, Any]:
        return {"size": self.size, "values": list(self.values)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.size, self.values = int(state["size"]), [float(v) for v in state["values"]]
