"""Reliability runs checkpoint every step and validate only at the end."""

from __future__ import annotations

import pytest


@pytest.fixture
def fast_overrides(fast_overrides):
    """The shared few-second run (tests/conftest.py), checkpointing every step, one logger."""
    return [*fast_overrides, "trainer.logger=[jsonl]", "trainer.save_freq=1", "trainer.test_freq=-1",
            "trainer.val_before_train=false"]
