"""Re-score a probe run's recorded responses with its task's current gold (reviews or constraints), step by step.

    python benchmarks/real_model/rescore.py RUN_DIR [--csv out.csv]

Gold never feeds back into training, so a run recorded under an earlier gold design (samples.jsonl) gives the same
trajectory's curve under the current one. Prints, per step: the proxy, the current gold on the rollouts and on
validation (where the step validated), its failed checks, and the run's KL, entropy, length and reference NLL.
"""

from __future__ import annotations

import argparse
import csv
import json
import sys
from collections import Counter, defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from label_samples import rescored  # a sibling script

METRICS = {"kl_seq": "actor/kl_seq_sum", "entropy": "actor/entropy", "length": "response_length/mean",
           "ref_nll": "hacking/ref_nll", "rep3": "hacking/repeated_ngram_share"}


def rescore(run: Path) -> list[dict]:
    groups: dict[tuple[int, str], list[dict]] = defaultdict(list)
    for line in (run / "samples.jsonl").read_text().splitlines():
        row = json.loads(line)
        groups[(row["step"], row["split"])].append(row)
    metrics = {}
    for line in (run / "metrics.jsonl").read_text().splitlines():
        rec = json.loads(line)
        if "actor/entropy" in rec:
            metrics[rec["step"]] = rec
    table = []
    for step in sorted({s for s, _ in groups}):
        out: dict = {"step": step}
        for split in ("train", "val"):
            rows = groups.get((step, split))
            if not rows:
                continue
            now = [rescored(r) for r in rows]
            out[f"{split}_proxy"] = sum(r["proxy"] for r in rows) / len(rows)
            out[f"{split}_gold"] = sum(r["gold"] for r in now) / len(rows)
            if split == "train":
                failed = Counter(k for r in now for k in r["failed"])
                out["train_failed"] = " ".join(f"{k}:{v}" for k, v in failed.most_common())
        for col, key in METRICS.items():
            if step in metrics:
                out[col] = metrics[step].get(key)
        table.append(out)
    return table


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("run", type=Path)
    parser.add_argument("--csv", type=Path, default=None)
    args = parser.parse_args(argv)
    table = rescore(args.run)
    cols = ["step", "train_proxy", "train_gold", "val_proxy", "val_gold", *METRICS, "train_failed"]
    for row in table:
        print("  ".join(f"{c}={row[c]:.3f}" if isinstance(row.get(c), float) else f"{c}={row.get(c, '')}"
                        for c in cols if c in row))
    if args.csv:
        with args.csv.open("w", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=cols)
            writer.writeheader()
            for row in table:
                writer.writerow({c: (f"{row[c]:.4g}" if isinstance(row.get(c), float) else row.get(c, ""))
                                 for c in cols})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
