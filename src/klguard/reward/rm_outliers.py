"""`hacking/rm_feature_outlier_share`: the share of a step's rollouts whose reward-model features are Mahalanobis
outliers from the features of the run's first rollouts (InfoRM, Miao et al. 2024: reward-hacked responses stand out
in the RM's latent space). The features are the RM's final hidden state at the token its score is read from
(klguard.reward.model_rm): a user's `reward_model.model.path` or the built-in learned RM, an ensemble's first
member.

The baseline is the rollouts of the first `guard.baseline_window` steps that had finite features. At the last of
them a Ledoit-Wolf shrinkage covariance is fit (scikit-learn; the shrinkage keeps it invertible with fewer rollouts
than feature dimensions) to half of them, and the threshold is the `guard.rm_outlier_quantile` quantile of the other
half's squared distances: rollouts the fit has not seen, as later steps' are (a threshold from the fitted rollouts
themselves sits too low: fresh rollouts of the same policy would cross it far more often than 1 - quantile when
the rollouts per feature dimension are few; benchmarks/rm_outlier_calibration.py). Every later step logs the share
of its rollouts beyond the threshold. Nothing is logged before the fit, nor on a step whose features are not all
finite (that step is not collected either); the guard's `rm_outlier` compares the share with its own first values.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from sklearn.covariance import LedoitWolf

from klguard.errors import UserError
from klguard.guard.signals import RM_OUTLIER

METRIC = RM_OUTLIER


def squared_distances(x: np.ndarray, location: np.ndarray, precision: np.ndarray) -> np.ndarray:
    """Squared Mahalanobis distance of each row of `x` [N, H] from `location` under `precision` (float64)."""
    centred = x.astype(np.float64) - location
    return ((centred @ precision) * centred).sum(1)


class RMFeatureOutliers:
    """Collects the baseline's features, fits it, then measures each step. `state_dict()` holds everything it
    remembers (tensors and numbers, for a checkpoint's tensor file), so a resumed run logs what an uninterrupted one
    does."""

    def __init__(self, window: int, quantile: float) -> None:
        self.window, self.quantile = window, quantile
        self.steps = 0  # baseline steps collected
        self.collected: list[np.ndarray] = []  # float32 [n, H] each
        self.location: np.ndarray | None = None  # float64 [H], once fitted
        self.precision: np.ndarray | None = None  # float64 [H, H]
        self.threshold: float | None = None

    @property
    def fitted(self) -> bool:
        return self.threshold is not None

    def width(self) -> int | None:
        if self.location is not None:
            return len(self.location)
        return self.collected[0].shape[1] if self.collected else None

    def update(self, features: torch.Tensor | None) -> dict[str, float]:
        """One step's features [N, H]: collected into the baseline (fit at its last step), or measured against it;
        returns `{METRIC: share}` once fitted, else nothing (also for missing or non-finite features)."""
        if features is None or features.ndim != 2 or len(features) == 0:
            return {}
        x = features.detach().float().cpu().numpy()
        if not np.isfinite(x).all():
            return {}
        width = self.width()
        if width is not None and x.shape[1] != width:
            raise UserError(f"{METRIC}: the reward model's features have {x.shape[1]} dimensions, its baseline "
                            f"{width}; resume with the reward model the run started with")
        if self.fitted:
            share = (squared_distances(x, self.location, self.precision) > self.threshold).mean()
            return {METRIC: float(share)}
        self.collected.append(x)
        self.steps += 1
        if self.steps >= self.window:
            self._fit()
        return {}

    def _fit(self) -> None:
        """Cross-fitted: the covariance from the baseline's even rows, the threshold from its odd rows' distances, so
        that rollouts the fit has not seen set it (fresh rollouts of an unchanged policy then cross it at about the
        rate 1 - quantile, whatever the rollouts per feature dimension)."""
        x = np.concatenate(self.collected).astype(np.float64)
        fit_rows, held_rows = (x[0::2], x[1::2]) if len(x) >= 2 else (x, x)
        fit = LedoitWolf().fit(fit_rows)
        self.location, self.precision = fit.location_, fit.precision_
        self.threshold = float(np.quantile(squared_distances(held_rows, self.location, self.precision),
                                           self.quantile))
        self.collected = []

    def state_dict(self) -> dict[str, Any]:
        if self.fitted:
            return {"location": torch.from_numpy(self.location.copy()),
                    "precision": torch.from_numpy(self.precision.copy()), "threshold": self.threshold}
        features = np.concatenate(self.collected) if self.collected else np.zeros((0, 0), np.float32)
        return {"steps": self.steps, "features": torch.from_numpy(features)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """The values of `state_dict()`; raises KeyError/TypeError on another kind of state."""
        if "threshold" in state:
            self.location = state["location"].to(torch.float64).numpy().copy()
            self.precision = state["precision"].to(torch.float64).numpy().copy()
            self.threshold, self.steps, self.collected = float(state["threshold"]), self.window, []
            return
        features = state["features"].to(torch.float32).numpy().copy()
        self.steps, self.collected = int(state["steps"]), [features] if len(features) else []
        self.location = self.precision = self.threshold = None
