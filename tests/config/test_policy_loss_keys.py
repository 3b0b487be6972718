"""The policy losses' keys: each loss_mode loads with its keys under verl's names, the clip ratios' range depends on
the loss (cispo's are truncation bounds), and a verl key under policy_loss that klguard lacks is still ignored."""

from __future__ import annotations

import pytest

from klguard.algo.policy_loss_registry import policy_loss_names
from klguard.config import ConfigError, load_config

A = "actor_rollout_ref.actor."
PL = A + "policy_loss."

# per loss, the keys it reads, set as verl's examples and docs set them
MODES = {
    "vanilla": {A + "clip_ratio_low": 0.2, A + "clip_ratio_high": 0.28},
    "gspo": {A + "clip_ratio_low": 0.0003, A + "clip_ratio_high": 0.0004, A + "loss_agg_mode": "seq-mean-token-mean"},
    "cispo": {A + "clip_ratio_low": 10, A + "clip_ratio_high": 5},
    "sapo": {A + "tau_pos": 1.0, A + "tau_neg": 1.05},
    "gpg": {},
    "dro": {PL + "dro_beta": 0.1},
    "geo_mean": {A + "clip_ratio_low": 0.4, A + "clip_ratio_high": 0.4},
    "dppo_tv": {A + "clip_ratio_low": 0.2, A + "clip_ratio_high": 0.2, A + "clip_ratio_c": 20.0},
    "dppo_kl": {A + "clip_ratio_low": 0.05, A + "clip_ratio_high": 0.05},
    "clip_cov": {PL + "clip_cov_ratio": 0.0002, PL + "clip_cov_lb": 1.0, PL + "clip_cov_ub": 5.0},
    "kl_cov": {PL + "kl_cov_ratio": 0.002, PL + "ppo_kl_coef": 1.0},
}


def _load(mode: str, keys: dict):
    return load_config(None, [f"{PL}loss_mode={mode}", *(f"{k}={v}" for k, v in keys.items())])


def _get(cfg, dotted: str):
    for part in dotted.split("."):
        cfg = getattr(cfg, part)
    return cfg


def test_every_registered_loss_has_a_case():
    assert set(MODES) == set(policy_loss_names())


@pytest.mark.parametrize("mode", sorted(MODES))
def test_each_loss_mode_loads_with_its_keys(mode: str):
    loaded = _load(mode, MODES[mode])
    assert loaded.ignored_verl_keys == []
    assert loaded.config.actor_rollout_ref.actor.policy_loss.loss_mode == mode
    for key, value in MODES[mode].items():
        assert _get(loaded.config, key) == value, key


def test_the_keys_have_verls_defaults():
    actor = load_config(None, []).config.actor_rollout_ref.actor
    options = actor.policy_loss
    assert (options.clip_cov_ratio, options.clip_cov_lb, options.clip_cov_ub) == (0.0002, 1.0, 5.0)
    assert (options.kl_cov_ratio, options.ppo_kl_coef, options.dro_beta) == (0.0002, 0.1, None)
    assert (actor.tau_pos, actor.tau_neg) == (1.0, 1.05)


@pytest.mark.parametrize("mode", sorted(set(MODES) - {"cispo"}))
@pytest.mark.parametrize("key", ["clip_ratio", "clip_ratio_low", "clip_ratio_high"])
def test_clip_ratios_of_one_or_more_are_cispos_alone(mode: str, key: str):
    with pytest.raises(ConfigError, match=rf"^{A}{key}=5\.0 must be in \(0, 1\) with policy_loss\.loss_mode={mode} "
                                          r"\(only cispo takes bounds >= 1\)$"):
        _load(mode, {**MODES[mode], A + key: 5})


@pytest.mark.parametrize("bad", [0, -1, "nan", "inf"])
def test_cispo_bounds_are_numbers_above_zero(bad):
    with pytest.raises(ConfigError, match=rf"^{A}clip_ratio_high=.* must be a finite number > 0$"):
        _load("cispo", {A + "clip_ratio_high": bad})


def test_the_loss_options_are_checked():
    with pytest.raises(ConfigError, match=rf"^{PL}dro_beta=None must be set \(a number > 0\) when loss_mode=dro$"):
        _load("dro", {})
    with pytest.raises(ConfigError, match=rf"^{PL}dro_beta=0\.0 must be a finite number > 0$"):
        _load("dro", {PL + "dro_beta": 0.0})
    with pytest.raises(ConfigError, match=rf"^{PL}clip_cov_lb=5\.0 must be < clip_cov_ub \(5\.0\)$"):
        _load("clip_cov", {PL + "clip_cov_lb": 5.0})
    for key in ("clip_cov_ratio", "kl_cov_ratio"):
        with pytest.raises(ConfigError, match=rf"^{PL}{key}=1\.5 must be in \(0, 1\]$"):
            _load("vanilla", {PL + key: 1.5})
    with pytest.raises(ConfigError, match=rf"^{A}tau_neg=0\.0 must be a finite number > 0$"):
        _load("sapo", {A + "tau_neg": 0.0})


def test_a_verl_key_under_policy_loss_that_klguard_lacks_is_ignored_and_a_typo_is_not():
    loaded = _load("vanilla", {PL + "_target_": "verl.workers.config.PolicyLossConfig"})
    assert loaded.ignored_verl_keys == [PL + "_target_"]
    with pytest.raises(ConfigError, match=rf"unknown config key {PL}clip_cov_ration; did you mean {PL}clip_cov_ratio"):
        _load("clip_cov", {PL + "clip_cov_ration": 0.1})
