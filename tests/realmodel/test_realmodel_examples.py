"""The launch lines in examples/ resolve to a valid configuration (every key known, every value checked)."""

from __future__ import annotations

import shlex
from pathlib import Path

import pytest

from klguard.config import load_config

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def _train_args(script: Path) -> list[str]:
    """The key=value arguments after `klguard train`, with the script's variables expanded."""
    text = script.read_text().replace("\\\n", " ")
    line = next(x for x in text.splitlines() if "klguard train" in x)
    env = {"MODEL": "/m", "RM": "/rm", "DATA": "/d", "HOME": "/h"}  # not the caller's environment
    for name, value in env.items():
        line = line.replace(f"${name}", value)
    tokens = shlex.split(line)
    return [t for t in tokens[tokens.index("train") + 1 :] if "=" in t]


@pytest.mark.parametrize("script", sorted(EXAMPLES.glob("*/*.sh")), ids=lambda p: p.name)
def test_example_line_is_a_valid_config(script):
    args = _train_args(script)
    assert len(args) > 20
    loaded = load_config(None, args)
    assert loaded.config.data.train_files == "/d/train.parquet"
    assert loaded.config.actor_rollout_ref.model.path == "/m"
