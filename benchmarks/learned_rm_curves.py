"""The learned-RM exploit's curves: validation gold, the RM's score on rollouts and the RM ensemble's spread.

    python benchmarks/hacking.py --out OUT --exploits learned_rm --sft-seeds 0 --seeds 1 \\
        --only verl_default fixed_0.3 guarded
    python benchmarks/learned_rm_curves.py OUT/hacking/learned_rm/sft0 \\
        --runs verl_default_s1 fixed_0.3_s1 guarded_s1 --out curves.png

One column per run (benchmarks/hacking.py's run directories): gold (never optimised) against the proxy PPO
optimises, and the gold-free signal that sees neither, with the guard's rollbacks and pauses as vertical lines.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

from klguard.commands.report import load_run

PANELS = (("val-core/", "validation gold (greedy)"), ("hacking/proxy_score", "RM score on rollouts (mean)"),
          ("hacking/rm_ensemble_std", "RM ensemble spread (std over members)"))


def smooth(values: list[float], window: int = 5) -> list[float]:
    return [sum(values[max(0, i - window + 1) : i + 1]) / (i + 1 - max(0, i - window + 1)) for i in range(len(values))]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("cell", type=Path, help="a cell's folder of run directories")
    parser.add_argument("--runs", nargs="+", required=True, help="run directory names inside it")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    runs = [load_run(args.cell / name, name) for name in args.runs]
    fig, axes = plt.subplots(len(PANELS), len(runs), figsize=(4.2 * len(runs), 2.6 * len(PANELS)), squeeze=False,
                             sharex=True, sharey="row")
    for col, run in enumerate(runs):
        for row, (key, title) in enumerate(PANELS):
            ax = axes[row][col]
            steps, values = run.series(key)
            ax.plot(steps, values if key.startswith("val-") else smooth(values), marker="o" if key.startswith(
                "val-") else None, markersize=3, linewidth=1.3)
            for event in run.events:
                if event.get("kind") in ("rollback", "pause"):
                    ax.axvline(event["step"], color="tab:red" if event["kind"] == "rollback" else "black", alpha=0.6)
            ax.set_title(f"{run.label}: {title}" if row == 0 else title, fontsize=9)
            ax.tick_params(labelsize=7)
            ax.grid(alpha=0.3)
        axes[-1][col].set_xlabel("training step", fontsize=8)
    fig.tight_layout()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(args.out, dpi=80)
    print(f"written: {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
