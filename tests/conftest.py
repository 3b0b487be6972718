"""Shared set-up for runs of the built-in task (a tiny SFT policy cached once per test session), and the marks of
the scenario folders: every test under e2e/, reliability/, distributed/, realmodel/ and golden/ launches training
or a real process and is marked `scenario` and with its folder's name (`pytest -m "not scenario"`: the unit tests)."""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

import pytest
import torch

TESTS = Path(__file__).parent
SCENARIO_FOLDERS = ("e2e", "reliability", "distributed", "realmodel", "golden")


def pytest_configure(config):
    """A fresh torch inductor cache for each test session. Inductor's on-disk cache does not key its CPU kernels by
    ATEN_CPU_CAPABILITY: kernels compiled under avx512 and loaded under avx2 made the compiled decode step return
    NaN on this project's AMD EPYC. A session must not depend on what an earlier one left in /tmp."""
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = tempfile.mkdtemp(prefix="klguard-tests-inductor-")


def pytest_unconfigure(config):
    shutil.rmtree(os.environ.get("TORCHINDUCTOR_CACHE_DIR", ""), ignore_errors=True)


def pytest_collection_modifyitems(config, items):
    for item in items:
        folder = Path(item.fspath).relative_to(TESTS).parts[0]
        if folder in SCENARIO_FOLDERS:
            item.add_marker(pytest.mark.scenario)
            item.add_marker(getattr(pytest.mark, folder))


@pytest.fixture(scope="session")
def sft_cache(tmp_path_factory):
    return tmp_path_factory.mktemp("sft-cache")


@pytest.fixture
def fast_overrides(sft_cache, tmp_path):
    """A few-second PPO run on the built-in task: small data, short responses, tiny SFT."""
    return [
        f"sft.cache_dir={sft_cache}", "sft.steps=30", "sft.batch_size=64", "sft.eval_every=30",
        f"trainer.default_local_dir={tmp_path / 'run'}", "trainer.progress_bar=false",
        "trainer.logger=[jsonl,tensorboard]", "trainer.report=false",
        "data.builtin_train_size=64", "data.builtin_val_size=16", "data.train_batch_size=16",
        "data.max_response_length=16", "actor_rollout_ref.actor.ppo_mini_batch_size=8",
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=4",
    ]


@pytest.fixture(scope="module")
def one_thread():
    """Tiny models: one intra-op thread avoids OpenMP barrier spinning when the CPUs are shared (>10x slower)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
