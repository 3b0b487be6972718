"""The GPU checks' assets, built here with the CPU tests' helpers (nothing from the network): the tiny Qwen2 policy
(BPE tokenizer, tied embeddings, 4 heads, 2 kv heads) at OUT/qwen2-tiny, GSM8K-format OUT/train.parquet (64 rows)
and OUT/test.parquet (16), and OUT/reward.py, a custom reward with a signal (length / 10).

    python benchmarks/gpu/tiny_assets.py OUT
"""

from __future__ import annotations

import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tests" / "realmodel"))
from conftest import build_policy, gsm8k_rows, question

REWARD = '''def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    return len(solution_str) / 10.0
'''

if __name__ == "__main__":
    root = Path(sys.argv[1])
    build_policy(root / "qwen2-tiny", [question(i)[0] for i in range(200)])
    pq.write_table(pa.Table.from_pylist(gsm8k_rows(64, "train")), root / "train.parquet")
    pq.write_table(pa.Table.from_pylist(gsm8k_rows(16, "test", offset=64)), root / "test.parquet")
    (root / "reward.py").write_text(REWARD)  # with every score equal, whitened advantages are rounding noise
