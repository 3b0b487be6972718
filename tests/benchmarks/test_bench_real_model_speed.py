"""benchmarks/real_model_speed.py's arithmetic and the worker's overrides (the benchmark itself trains SmolLM2 for
minutes and is not run here)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "benchmarks"


@pytest.fixture(scope="module")
def speed():
    sys.path.insert(0, str(BENCH))  # the scripts import each other as run from benchmarks/
    try:
        import real_model_speed
        yield real_model_speed
    finally:
        sys.path.remove(str(BENCH))


def test_update_flops_count_a_groups_prompt_once_and_the_head_per_position(speed):
    head = speed.VOCAB * speed.HIDDEN
    ready = {"matmul_params": head + 1000}
    shapes = {"rows": 4, "groups": 2, "prompt_width": 10, "response_width": 5}
    body_tokens = 2 * 10 + 4 * 4  # each group's prompt once, every response position but the last
    assert speed.update_flops(shapes, ready) == 6 * (1000 * body_tokens + head * 4 * 5)


def test_every_variant_sets_only_known_keys(speed):
    from klguard.config import load_config

    for overrides in speed.VARIANTS.values():
        load_config(overrides=list(overrides))  # an unknown key or a bad value raises


def test_the_kernels_interleave_and_keep_every_timing(speed):
    calls = []
    out = speed._interleaved({"a": lambda: lambda: calls.append("a"), "b": lambda: lambda: calls.append("b")},
                             rounds=2)
    assert calls == ["a", "b"] * 3 and set(out) == {"a", "b"} and len(out["a"]["all_s"]) == 3
