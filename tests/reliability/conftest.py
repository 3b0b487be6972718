"""Reliability runs checkpoint every step and validate only at the end."""

from __future__ import annotations

import pytest
from reliability_runs import stop_started


@pytest.fixture(autouse=True)
def no_run_left_behind():
    """A test that fails while its `klguard train` child runs (an assertion, a timeout) must not leave it running:
    it would hold a core and write into a deleted folder for minutes."""
    yield
    stop_started()


@pytest.fixture
def fast_overrides(fast_overrides):
    """The shared few-second run (tests/conftest.py), checkpointing every step, one logger."""
    return [*fast_overrides, "trainer.logger=[jsonl]", "trainer.save_freq=1", "trainer.test_freq=-1",
            "trainer.val_before_train=false"]
