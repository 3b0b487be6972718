"""benchmarks/matmul_shapes.py's shapes, and the throughput benchmark's --profile overrides (neither run in full)."""

from __future__ import annotations

import pytest

from bench_scripts import import_scripts


@pytest.fixture(scope="module")
def bench():
    with import_scripts("matmul_shapes", "throughput_klguard") as scripts:
        yield scripts


def test_every_matrix_of_a_layer_in_every_pass(bench):
    matmul_shapes, _ = bench
    assert matmul_shapes.linear_shapes(384, 1024) == {"attn": (384, 384), "mlp_up": (384, 1024),
                                                      "mlp_down": (1024, 384)}
    assert matmul_shapes.gflops(16, 8, 4, repeats=1) > 0


def test_profile_step_adds_the_global_profiler_keys_klguard_accepts(bench, tmp_path):
    _, throughput_klguard = bench
    from klguard.config import load_config

    spec = {"algo": "grpo", "reward": "rule", "dtype": "fp32", "policy": "p", "rm": "r", "train": "t.parquet",
            "val": "v.parquet", "rollouts": 64, "n": 4, "response_length": 32, "max_steps": 10, "seed": 1,
            "run_dir": str(tmp_path / "run")}
    assert not any(o.startswith("global_profiler") for o in throughput_klguard.overrides(spec))
    loaded = load_config(overrides=throughput_klguard.overrides({**spec, "profile_step": 2})).config
    assert (loaded.global_profiler.tool, loaded.global_profiler.steps) == ("torch", [2])
    assert loaded.global_profiler.save_path == str(tmp_path / "run" / "profile")
