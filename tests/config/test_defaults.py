"""The defaults did not move: the flattened default config against a snapshot taken before the config redesign."""

from __future__ import annotations

import json
from pathlib import Path

from klguard.config import config_to_dict, load_config
from klguard.config.loader import _flatten

SNAPSHOT = Path(__file__).with_name("default_config.json")
# verl keys that nothing read: no longer in the schema, so they join the one "verl keys ignored" warning (klguard's
# old log-probs come out of the sampling loop: there is no old-log-prob forward to micro-batch)
REMOVED = {"data.reward_fn_key", "data.validation_shuffle",
           "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu"}


def test_defaults_match_the_snapshot() -> None:
    snapshot = json.loads(SNAPSHOT.read_text())
    flat = dict(_flatten(config_to_dict(load_config().config)))
    assert flat == {key: value for key, value in snapshot.items() if key not in REMOVED}
    assert snapshot.keys() >= REMOVED


def test_removed_keys_are_ignored_verl_keys() -> None:
    loaded = load_config(None, ["data.reward_fn_key=source", "data.validation_shuffle=true",
                                "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=4"])
    assert loaded.ignored_verl_keys == sorted(REMOVED)
