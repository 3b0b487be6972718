"""GuardConfig fields and validation, the scale rule, Action records, and the guard's import surface."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
from dataclasses import fields

import pytest

from klguard.guard import ACTION_KINDS, INPUT_METRICS, Action, GuardConfig, KLGuard, default_target_kl


def test_every_field_has_a_one_line_help() -> None:
    for f in dataclasses.fields(GuardConfig):
        text = f.metadata.get("help", "")
        assert text and "\n" not in text and len(text) < 110, f.name


def test_defaults_are_the_seed_values_except_the_calibrated_ones() -> None:
    cfg = GuardConfig()
    assert (cfg.ppo_kl_max, cfg.grad_norm_max, cfg.grad_clip_on_alarm) == (0.025, 10.0, 1.0)
    assert (cfg.val_drop_max, cfg.target_kl_step, cfg.slow_kl_coef_factor) == (0.05, 0.005, 1.2)
    assert (cfg.warmup_ratio, cfg.warmup_kl_coef, cfg.max_rollbacks) == (0.2, None, 3)
    # calibrated on the demo (docs/guard.md): each help names the value the demo measured against
    assert (cfg.penalty_share_max, cfg.kl_hard_limit, cfg.hacking_action) == (0.5, 0.1, "rollback")
    assert (cfg.rollback_kl_coef_factor, cfg.rollback_lr_factor, cfg.length_growth_max) == (6.0, 0.5, 0.5)
    assert cfg.reanchor_on_rollback
    helps = {f.name: f.metadata["help"] for f in fields(GuardConfig)}
    assert "a raise lifts the share" in helps["penalty_share_max"] and "reaches 0.05" in helps["kl_hard_limit"]
    cfg.validate()


@pytest.mark.parametrize(
    ("field", "value"),
    [("ppo_kl_max", 0.0), ("lr_cut_factor", 1.5), ("lr_floor_scale", 0.0), ("patience", 0),
     ("kl_coef_raise_factor", 0.9), ("kl_hard_limit", float("nan")), ("cooldown", -1), ("max_rollbacks", -1),
     ("spike_min_history", 21), ("warmup_ratio", 1.5), ("warmup_kl_coef", -0.1), ("length_corr_max", 2.0),
     ("hacking_action", "explode"), ("entropy_collapse_ratio", 0.0), ("val_drop_max", -0.1),
     ("reanchor_rules", ["kl_hard", "spike"]), ("stable_kl_share", 0.0)],
)
def test_validate_names_the_bad_field(field: str, value: object) -> None:
    with pytest.raises(ValueError, match=f"guard.{field}"):
        GuardConfig(**{field: value}).validate()
    with pytest.raises(ValueError, match=f"guard.{field}"):
        KLGuard(GuardConfig(**{field: value}), total_steps=10)


def test_checks_name_the_field_under_the_given_key() -> None:
    """Mounted elsewhere, the guard's config names its fields under that key (klguard's schema uses guard.*)."""
    from klguard.errors import ConfigError
    from klguard.fields import check_tree

    with pytest.raises(ConfigError, match=r"^watch.patience=0 must be >= 1$"):
        check_tree(GuardConfig(patience=0), "watch")
    with pytest.raises(ConfigError, match=r"^watch.ppo_kl_max=inf must be finite$"):
        check_tree(GuardConfig(ppo_kl_max=float("inf")), "watch")


def test_guard_constructor_checks() -> None:
    with pytest.raises(ValueError, match="total_steps"):
        KLGuard(GuardConfig(), total_steps=-1)
    with pytest.raises(ValueError, match="target_kl"):
        KLGuard(GuardConfig(), total_steps=1, target_kl=0.0)
    with pytest.raises(ValueError, match="kl_coef"):
        KLGuard(GuardConfig(), total_steps=1, kl_coef=float("inf"))
    assert KLGuard(GuardConfig(), total_steps=1).target_kl == 0.015


def test_default_target_kl_scale_rule() -> None:
    assert [default_target_kl(n) for n in (1, 8, 32, 33, 128)] == [0.015, 0.015, 0.015, 0.01, 0.01]
    for bad in (0, -1, 1.5, True):
        with pytest.raises(ValueError, match="nnodes"):
            default_target_kl(bad)  # type: ignore[arg-type]


def test_action_records() -> None:
    assert set(ACTION_KINDS) == {"warn", "cut_lr", "raise_kl_coef", "lower_target_kl", "set_grad_clip", "rollback",
                                 "pause", "freeze_kl_coef", "release_kl_coef", "reanchor_reference"}
    action = Action("cut_lr", "Cut.", "actor/ppo_kl", 0.03, 0.025, 1.0, 0.5, 7, "ppo_kl")
    assert json.loads(json.dumps(action.to_dict())) == dataclasses.asdict(action)
    with pytest.raises(dataclasses.FrozenInstanceError):
        action.new = 0.1  # type: ignore[misc]
    with pytest.raises(ValueError, match="unknown action kind"):
        Action("reboot", "No.", None, None, None, None, None, 1)


def test_guard_metrics_names() -> None:
    guard = KLGuard(GuardConfig(), total_steps=10, kl_coef=0.1)
    guard.observe(1, {"actor/reward_kl_penalty": 0.01})
    names = set(guard.guard_metrics())
    assert {"guard/hacking_alarm", "guard/target_kl", "guard/kl_coef", "guard/lr_scale", "guard/rollbacks",
            "guard/in_warmup", "guard/stable", "guard/alarm_ppo_kl", "guard/alarm_kl_hard"} <= names
    assert all(n.startswith("guard/") for n in names)
    assert "actor/ppo_kl" in INPUT_METRICS


def test_guard_is_pure_python() -> None:
    """Usable from any trainer: importing the guard pulls in neither torch nor klguard's trainer."""
    code = ("import sys, klguard.guard; bad = [m for m in ('torch', 'klguard.ppo.trainer', 'klguard.model', "
            "'torch.distributed') if m in sys.modules]; print(bad); sys.exit(1 if bad else 0)")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr
