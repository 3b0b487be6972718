"""What `klguard calibrate` concludes from its sweep: per-run figures, the gold-vs-KL fit and the
recommended target_kl. Pure functions of the runs' metrics, so they are tested on scripted data.

The fit is Gao, Schulman and Hilton (2022)'s functional form for RL, R(d) = d (a - b ln d), with
d = sqrt(KL to the reference) and R the score gained over the starting policy. Its maximum is at
ln d* = a/b - 1 when b > 0.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass

import numpy as np

from klguard.commands.report.runs import RunRecord
from klguard.guard.signals import KL_UNIT_METRICS

KL_METRIC = KL_UNIT_METRICS
HACKING_METRIC = "hacking/rate"
MIN_R2 = 0.3
"""A fit explaining less of the variance than this is reported but not used for the recommendation."""


@dataclass
class SweepPoint:
    target_kl: float
    final_score: float | None
    best_score: float | None
    hacking_rate: float | None  # mean of the last 10 steps; None when the task has no gold labels
    mean_kl: float | None  # over the whole run, in the controller's unit
    final_kl: float | None  # mean of the last 10 steps
    response_length: float | None
    steps: int


@dataclass
class Fit:
    a: float
    b: float
    r2: float
    n: int

    def predict(self, kl: float) -> float:
        d = math.sqrt(max(kl, 1e-12))
        return d * (self.a - self.b * math.log(d))

    @property
    def peak_kl(self) -> float | None:
        """The KL that maximises R(d), or None when the fit has no interior maximum (b <= 0)."""
        if self.b <= 0:
            return None
        return math.exp(2 * (self.a / self.b - 1))


def window_mean(steps: list[int], values: list[float], end: int, width: int = 10) -> float | None:
    picked = [v for s, v in zip(steps, values, strict=True) if end - width < s <= end]
    return sum(picked) / len(picked) if picked else None


def summarize(run: RunRecord, target_kl: float, metric: str, kl_unit: str) -> SweepPoint:
    _kl_steps, kl_values = run.series(KL_METRIC[kl_unit])
    return SweepPoint(
        target_kl=target_kl, final_score=run.last(metric), best_score=run.best(metric),
        hacking_rate=run.mean_last(HACKING_METRIC, 10), mean_kl=sum(kl_values) / len(kl_values) if kl_values else None,
        final_kl=run.mean_last(KL_METRIC[kl_unit], 10), response_length=run.mean_last("response_length/mean", 10),
        steps=run.steps)


def fit_points(run: RunRecord, metric: str, kl_unit: str) -> list[tuple[float, float]]:
    """(KL, score gain over step 0) at every validation after step 0; KL = mean of the 10 steps before."""
    score_steps, scores = run.series(metric)
    kl_steps, kl_values = run.series(KL_METRIC[kl_unit])
    if not score_steps or score_steps[0] != 0:
        return []
    start = scores[0]
    out = []
    for step, score in zip(score_steps[1:], scores[1:], strict=True):
        kl = window_mean(kl_steps, kl_values, step)
        if kl is not None:
            out.append((max(kl, 0.0), score - start))
    return out


def fit_gao(points: Sequence[tuple[float, float]]) -> Fit | None:
    """Least squares of gain = a d - b d ln d over the points; None with fewer than 3 usable points."""
    usable = [(math.sqrt(kl), gain) for kl, gain in points if kl > 0]
    if len(usable) < 3:
        return None
    d = np.array([p[0] for p in usable])
    y = np.array([p[1] for p in usable])
    design = np.stack([d, -d * np.log(d)], axis=1)
    (a, b), *_ = np.linalg.lstsq(design, y, rcond=None)
    residual = y - design @ np.array([a, b])
    total = float(((y - y.mean()) ** 2).sum())
    r2 = 1 - float((residual ** 2).sum()) / total if total > 0 else 0.0
    return Fit(float(a), float(b), r2, len(usable))


@dataclass
class Recommendation:
    target_kl: float | None
    basis: str  # how it was chosen, in a sentence
    feasible: list[float]


def recommend(points: Sequence[SweepPoint], fit: Fit | None, max_hacking_rate: float) -> Recommendation:
    """The target_kl with the best fitted score among grid values whose hacking rate is within the limit.

    Without a usable fit (too few points, R^2 under MIN_R2, or no interior maximum), the best
    measured final score among those values. Without hacking labels every value is admissible.
    """
    feasible = [p for p in points if p.final_score is not None
                and (p.hacking_rate is None or p.hacking_rate <= max_hacking_rate)]
    if not feasible:
        return Recommendation(None, f"every target_kl that finished hacked above {max_hacking_rate:g}", [])
    targets = [p.target_kl for p in feasible]
    if fit is not None and fit.r2 >= MIN_R2 and fit.peak_kl is not None:
        best = max(feasible, key=lambda p: fit.predict(p.target_kl))
        basis = (f"maximises the fitted score R(d) = d({fit.a:.3g} - {fit.b:.3g} ln d) (R^2 {fit.r2:.2f}, peak at "
                 f"KL {fit.peak_kl:.3g}) among targets with hacking rate <= {max_hacking_rate:g}")
    else:
        best = max(feasible, key=lambda p: (p.final_score, -p.target_kl))
        why = "no fit" if fit is None else f"fit R^2 {fit.r2:.2f}" + ("" if fit.peak_kl else ", no peak")
        basis = f"best measured final score ({why}) among targets with hacking rate <= {max_hacking_rate:g}"
    return Recommendation(best.target_kl, basis, targets)


def as_dict(obj) -> dict:
    return asdict(obj)
