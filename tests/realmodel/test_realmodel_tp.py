"""A real Hugging Face folder under tensor parallelism: the tiny Qwen2 (BPE tokenizer, grouped kv heads, lm_head tied
to the embedding) and its GAE critic on GSM8K-format parquet, split over 2 gloo ranks, against one process.

The custom reward (7 + length / 100) gives the advantages a signal: with scores all equal the whitened advantages
would be rounding noise, and any two layouts would disagree on them. Tolerance as tests/distributed (float32
rounding at the policy's depth and width, tests/tolerances.py).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from transformers import AutoConfig

from tolerances import forward_terms, metric_tol

TP2 = ["actor_rollout_ref.actor.strategy=fsdp_turbo", "critic.strategy=fsdp_turbo",
       "actor_rollout_ref.actor.fsdp_config.turbo_config.distributed.tensor_parallel_size=2"]
KEYS = ("critic/score/mean", "actor/pg_loss", "actor/entropy", "actor/reward_kl_penalty", "critic/vf_loss",
        "actor/grad_norm", "critic/grad_norm", "critic/advantages/mean")


def _train(prefix: list[str], overrides: list[str], run_dir: Path) -> dict[int, dict]:
    env = dict(os.environ, OMP_NUM_THREADS="1")
    env.pop("WORLD_SIZE", None)
    proc = subprocess.run([*prefix, "-m", "klguard", "train", *overrides, f"trainer.default_local_dir={run_dir}"],
                          env=env, capture_output=True, text=True, timeout=300, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return {r["step"]: r for r in map(json.loads, (run_dir / "metrics.jsonl").read_text().splitlines())}


def test_qwen2_split_over_two_tp_ranks_matches_one_process(base_overrides, assets, tmp_path):
    overrides = [*[o for o in base_overrides if not o.startswith("trainer.default_local_dir")],
                 f"custom_reward_function.path={assets.reward_file}", "trainer.debug=true"]
    one = _train([sys.executable], overrides, tmp_path / "one")
    tp = _train([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2"],
                [*overrides, *TP2], tmp_path / "tp")
    terms = forward_terms(AutoConfig.from_pretrained(assets.policy))
    for step in (1, 2, 3):
        for key in KEYS:
            tol = metric_tol(list(one.values()), key, step, 4, terms)
            assert tp[step][key] == pytest.approx(one[step][key], rel=0, abs=tol), (step, key)
    checks = [json.loads(line) for line in (tmp_path / "tp" / "rank_checks.jsonl").read_text().splitlines()]
    assert checks[-1]["tp_rank"] == [0, 1] and checks[-1]["actor_params"][0] < checks[-1]["actor_params_total"]
