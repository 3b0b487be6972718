"""The defaults did not move: the flattened default config against a snapshot taken before the config redesign."""

from __future__ import annotations

import json
from pathlib import Path

from klguard.config import config_to_dict, load_config
from klguard.config.loader import _flatten

SNAPSHOT = Path(__file__).with_name("default_config.json")


def test_defaults_match_the_snapshot() -> None:
    snapshot = json.loads(SNAPSHOT.read_text())
    flat = dict(_flatten(config_to_dict(load_config().config)))
    assert flat == snapshot
