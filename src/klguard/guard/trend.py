"""Robust statistics of a short series, for the rules that judge a trend: the Mann-Kendall test (is there a monotone
trend, whatever its shape and whatever the outliers) and the Theil-Sen slope (the median of the pairwise slopes).
Pure Python: the guard imports nothing outside the standard library; a window is tens of values, so the O(n^2) pairs
cost nothing."""

from __future__ import annotations

import math
from collections.abc import Sequence

from klguard.guard.signals import median


def mann_kendall(values: Sequence[float]) -> float:
    """The Mann-Kendall statistic's normal score Z (with the continuity correction and the variance's correction for
    ties): above 1.645 a rising trend, below -1.645 a falling one, at the one-sided 5% level. 0 for fewer than 3
    values."""
    n = len(values)
    if n < 3:
        return 0.0
    s = sum((values[j] > values[i]) - (values[j] < values[i]) for i in range(n) for j in range(i + 1, n))
    counts: dict[float, int] = {}
    for v in values:
        counts[v] = counts.get(v, 0) + 1
    var = (n * (n - 1) * (2 * n + 5) - sum(t * (t - 1) * (2 * t + 5) for t in counts.values())) / 18
    if var <= 0 or s == 0:
        return 0.0
    return (s - 1) / math.sqrt(var) if s > 0 else (s + 1) / math.sqrt(var)


def theil_sen(steps: Sequence[float], values: Sequence[float]) -> float:
    """The Theil-Sen slope of `values` over `steps`: the median of the slopes of every pair at two different steps
    (0 with fewer than two)."""
    slopes = [(values[j] - values[i]) / (steps[j] - steps[i])
              for i in range(len(values)) for j in range(i + 1, len(values)) if steps[j] != steps[i]]
    return median(slopes) if slopes else 0.0


def one_sided_p(z: float) -> float:
    """The one-sided p-value of a normal score (the chance of a Z at least this far from 0 in its direction)."""
    return 0.5 * math.erfc(abs(z) / math.sqrt(2))
