"""verl's adapter (klguard.integrations.verl.host.VerlHost, inside verl's own trainer with stubbed workers) passes
the session's host tests (tests/guard/host_contract.py), as the fifth host of tests/guard does."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

import pytest

verl = pytest.importorskip("verl") if os.environ.get("CI") != "true" else __import__("verl")

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "guard"))  # the contract lives beside the session's tests
from host_contract import CHECKS  # noqa: E402
from verl_stubs import trainer_with_stubs, verl_config  # noqa: E402

from klguard.guard.signals import ENTROPY, KL_COEF, LENGTH, PPO_KL, REF_KL, SCORE  # noqa: E402
from klguard.integrations.verl.host import STATE_FILE  # noqa: E402


class VerlHarness:
    """verl's loop as the contract drives it: the controller steps during the step (apply_kl_penalty), a checkpoint is
    saved during the step, before the metrics the guard decides on."""

    def __init__(self, run_dir: Path, guard: dict[str, Any], resume: bool = False) -> None:
        self.run_dir, self.guard = run_dir, guard
        overrides = [f"+klguard.guard.{key}={value}" for key, value in guard.items()]
        self.trainer = trainer_with_stubs(verl_config(run_dir, "algorithm.kl_ctrl.target_kl=0.01", *overrides))
        self.lines: list[str] = []
        self.trainer._guard().say = self.lines.append
        if resume:
            self.trainer._load_checkpoint()  # verl's: the newest global_step_N (trainer.resume_mode=auto)
        self.session = self.trainer.klguard.session

    def run(self, step: int, kl: float = 0.01, *, save: bool = False) -> None:
        trainer = self.trainer
        trainer.global_steps = step
        coef = trainer.kl_ctrl_in_reward.value
        trainer.kl_ctrl_in_reward.update(current_kl=kl, n_steps=256)
        if save:
            trainer._save_checkpoint()
        metrics = {REF_KL: kl, KL_COEF: coef, PPO_KL: 0.001, SCORE: 0.5, LENGTH: 10.0, ENTROPY: 1.0}
        trainer._guard().after_step(trainer, step, metrics)

    def coefficient(self) -> float:
        return self.trainer.kl_ctrl_in_reward.value

    def restored(self) -> list[int]:
        return [int(Path(path).parent.name.rpartition("_")[2]) for path in self.trainer.actor_rollout_wg.loaded]

    def paused(self) -> bool:
        return self.trainer.total_training_steps == self.trainer.global_steps

    def said(self) -> list[str]:
        return self.lines

    def events(self) -> list[dict[str, Any]]:
        path = self.run_dir / "ckpt" / "events.jsonl"
        return [json.loads(line) for line in path.read_text().splitlines()] if path.is_file() else []

    def written_state(self, step: int) -> dict[str, Any]:
        return json.loads((self.run_dir / "ckpt" / f"global_step_{step}" / STATE_FILE).read_text())

    def resume(self) -> VerlHarness:
        return VerlHarness(self.run_dir, self.guard, resume=True)


@pytest.mark.parametrize("check", CHECKS, ids=lambda check: check.__name__.removeprefix("check_"))
def test_verls_host_passes_the_sessions_host_tests(check, tmp_path):
    check(lambda run="run", **guard: VerlHarness(tmp_path / run, guard))
