"""Where `hacking/rm_feature_outlier_share` starts: the share of fresh rollouts of the baseline's own distribution that
the tracker flags, against the baseline's rollouts per feature dimension.

The features are draws of a correlated Gaussian (a fixed random linear map of standard normals); the tracker
(klguard.reward.rm_outliers, quantile 0.99) collects `--steps` baseline steps, then measures 5,000 fresh draws and
2,000 draws shifted by one standard deviation along every underlying normal. The threshold is cross-fitted (the
covariance from half the baseline, the quantile from the other half), so fresh draws should be flagged at about 1 -
quantile at every ratio; the shifted share shows what the fit still sees with few rollouts per dimension.
Writes ``benchmarks/results/rm_outlier_calibration.json``.

    python benchmarks/rm_outlier_calibration.py [--dims 64] [--steps 10] [--seeds 3]
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np
import torch

from klguard.reward.rm_outliers import METRIC, RMFeatureOutliers

OUT = Path(__file__).parent / "results" / "rm_outlier_calibration.json"
PER_DIMENSION = (0.625, 2, 5, 10, 40)
QUANTILE = 0.99


def measure(dims: int, rollouts: int, steps: int, seed: int) -> tuple[float, float]:
    """(share of fresh inliers, share of shifted draws) after a baseline of `rollouts` in `steps` steps."""
    rng = np.random.default_rng(seed)
    mix = rng.normal(size=(dims, dims)) / np.sqrt(dims)

    def draw(n: int, shift: float = 0.0) -> torch.Tensor:
        return torch.from_numpy(((rng.normal(size=(n, dims)) + shift) @ mix.T).astype(np.float32))

    tracker = RMFeatureOutliers(steps, QUANTILE)
    for _ in range(steps):
        tracker.update(draw(rollouts // steps))
    return tracker.update(draw(5000))[METRIC], tracker.update(draw(2000, 1.0))[METRIC]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dims", type=int, default=64)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--seeds", type=int, default=3)
    args = parser.parse_args()
    rows = []
    for ratio in PER_DIMENSION:
        rollouts = int(ratio * args.dims)
        shares = [measure(args.dims, rollouts, args.steps, seed) for seed in range(args.seeds)]
        inliers, shifted = (float(np.mean(s)) for s in zip(*shares, strict=True))
        rows.append({"rollouts_per_dimension": ratio, "baseline_rollouts": rollouts, "inlier_share": inliers,
                     "shifted_share": shifted})
        print(f"{ratio:6g} rollouts per dimension ({rollouts:5d}): inliers {inliers:.3f}, shifted {shifted:.3f}")
    OUT.write_text(json.dumps({"dims": args.dims, "steps": args.steps, "seeds": args.seeds, "quantile": QUANTILE,
                               "rows": rows}, indent=1) + "\n")


if __name__ == "__main__":
    main()
