"""With the KL as a loss only (GRPO style), the KL controller and the guard steer the KL-loss coefficient, as they
steer the in-reward one otherwise; it is logged as `actor/kl_coef`, saved and resumed."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from klguard.commands.cli import main

LOSS_ONLY = ["algorithm.use_kl_in_reward=false", "actor_rollout_ref.actor.use_kl_loss=true",
             "actor_rollout_ref.actor.kl_loss_coef=0.01", "algorithm.adv_estimator=grpo",
             "actor_rollout_ref.rollout.n=2", "trainer.test_freq=-1", "trainer.val_before_train=false"]


def _rows(run: Path) -> dict[int, dict]:
    return {r["step"]: r for r in map(json.loads, (run / "metrics.jsonl").read_text().splitlines())}


def _train(overrides: list[str]) -> None:
    assert main(["train", *overrides]) == 0


@pytest.mark.parametrize(("controller", "moves"), [("fixed", False), ("adaptive", True)])
def test_the_controller_steers_the_kl_loss_coefficient(controller, moves, fast_overrides, tmp_path):
    _train([*fast_overrides, *LOSS_ONLY, f"algorithm.kl_ctrl.type={controller}", "algorithm.kl_ctrl.horizon=20",
            "guard.enable=false", "trainer.total_training_steps=3"])
    rows = _rows(tmp_path / "run")
    coefs = [rows[s]["actor/kl_coef"] for s in (1, 2, 3)]
    assert coefs[0] == 0.01  # it starts at kl_loss_coef, not at kl_ctrl.kl_coef (0.05)
    assert (len(set(coefs)) > 1) == moves
    assert [rows[s]["actor/reward_kl_penalty_coeff"] for s in (1, 2, 3)] == coefs  # one coefficient, logged twice


def test_the_guard_raises_the_kl_loss_coefficient_and_a_resume_keeps_it(fast_overrides, tmp_path):
    """lr 0.003 pushes the KL over guard.kl_hard_limit on step 2: a rollback, whose tightening raises the KL-loss
    coefficient 6x (guard.rollback_kl_coef_factor); the next step's loss uses it, and so does a resumed run."""
    run = tmp_path / "run"
    blow_up = [*fast_overrides, *LOSS_ONLY, "actor_rollout_ref.actor.optim.lr=0.003", "trainer.save_freq=1"]
    _train([*blow_up, "trainer.total_training_steps=3"])
    events = [json.loads(line) for line in (run / "events.jsonl").read_text().splitlines()]
    raise_ = next(e for e in events if e["kind"] == "raise_kl_coef")
    assert raise_["old"] == pytest.approx(0.01) and raise_["new"] == pytest.approx(0.06)
    rows = _rows(run)
    assert rows[raise_["step"] + 1]["actor/kl_coef"] == pytest.approx(raise_["new"])
    resumed = tmp_path / "resumed"
    shutil.copytree(run, resumed)
    _train([*[o for o in blow_up if not o.startswith("trainer.default_local_dir")],
            f"trainer.default_local_dir={resumed}", "trainer.total_training_steps=4"])
    assert _rows(resumed)[4]["actor/kl_coef"] == pytest.approx(rows[3]["actor/kl_coef"])  # fixed controller
