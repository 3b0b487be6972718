"""Final gold of finished runs on more held-out problems than their own last validation.

A run's final validation scores 256 problems, so two runs' final gold differ by a few hundredths by chance alone
(one problem is 0.004). This re-scores each run's last checkpoint (greedy, gold rule) on `--problems` held-out
problems of the run's own validation split (its config.yaml, `trainer.seed` included, so contenders of one PPO
seed share their problems), and writes one figure per run.

    python benchmarks/final_gold.py RUN_DIR ... --out FILE [--problems 2048]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from klguard.commands.evaluate import evaluate_checkpoint
from klguard.config import load_config
from klguard.errors import UserError

GOLD = "val-core/"


def final_gold(run_dir: Path, problems: int) -> float:
    """Greedy gold of the run's latest checkpoint on `problems` rows of its own validation split."""
    config = load_config(run_dir / "config.yaml", [f"data.builtin_val_size={problems}"]).config
    metrics = evaluate_checkpoint(config, run_dir)
    return next(v for k, v in metrics.items() if k.startswith(GOLD))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("runs", type=Path, nargs="+", help="klguard run directories (config.yaml, checkpoints)")
    parser.add_argument("--problems", type=int, default=2048, help="held-out problems per run")
    parser.add_argument("--out", type=Path, required=True, help="results file (JSON)")
    args = parser.parse_args(argv)
    missing = next((r for r in args.runs if not (r / "config.yaml").is_file()), None)
    if missing is not None:
        parser.error(f"not a klguard run directory (no config.yaml): {missing}")
    results = {}
    try:
        for run in args.runs:
            results[str(run)] = gold = final_gold(run, args.problems)
            print(f"{run}: final gold {gold:.4f} on {args.problems} problems", flush=True)
    except UserError as exc:
        print(f"final_gold.py: {exc}", file=sys.stderr)
        return 2
    args.out.write_text(json.dumps({"problems": args.problems, "final_gold": results}, indent=1) + "\n")
    print(f"written: {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
