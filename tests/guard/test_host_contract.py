"""A fifth host, built on the session alone as a user would for a training loop of their own (`LoopHost`: one class
that carries out actions and spells its keys), passes the session's host tests (host_contract.py)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from host_contract import CHECKS

from klguard.algo.kl import build_kl_controller
from klguard.guard import GuardConfig, GuardSession, HostKeys, KLSetup
from klguard.guard.signals import ENTROPY, KL_COEF, LENGTH, PPO_KL, REF_KL, SCORE

KEYS = HostKeys(kl_coef="--kl-coef", lr="--lr", save_freq="--save-every", resume="rerun with --resume")


class Loop:
    """A user's training loop: its weights (the last step trained), an adaptive KL controller, checkpoints as
    folders with the guard's state beside the weights."""

    def __init__(self, run_dir: Path) -> None:
        self.run_dir = run_dir
        self.weights = {"trained_to": 0}
        self.kl_ctrl = build_kl_controller("adaptive", 0.05, target_kl=0.01, horizon=10000)
        self.lr_scale, self.grad_clip, self.stop = 1.0, None, False

    def folder(self, step: int) -> Path:
        return self.run_dir / f"ckpt_{step}"

    def save(self, step: int, guard_state: dict[str, Any]) -> None:
        self.folder(step).mkdir(parents=True, exist_ok=True)
        (self.folder(step) / "weights.json").write_text(json.dumps(self.weights))
        GuardSession.save_state(self.folder(step) / "guard.json", guard_state)

    def load(self, step: int) -> int | None:
        if not self.folder(step).is_dir():
            return None
        self.weights = json.loads((self.folder(step) / "weights.json").read_text())
        return step


class LoopHost:
    """The loop as the host of its guard session (klguard.guard.GuardHost)."""

    def __init__(self, loop: Loop) -> None:
        self.loop, self.restored, self.lines, self.events = loop, [], [], []

    def set_kl_coef(self, value, *, frozen):
        if value is not None:
            self.loop.kl_ctrl.value = value

    def set_target_kl(self, value):
        self.loop.kl_ctrl.target_kl = value

    def set_lr_scale(self, scale, ratio):
        self.loop.lr_scale = scale

    def set_grad_clip(self, clip):
        self.loop.grad_clip = clip

    def restore_checkpoint(self, step):
        restored = self.loop.load(step)
        if restored is not None:
            self.restored.append(restored)
        return restored

    def restore_reference(self, reference_step):
        return None  # keeps no copy of the reference

    def reanchor_reference(self, step):
        pass

    def pause(self, reason):
        self.loop.stop = True

    def write_event(self, record):
        self.events.append(record)

    def say(self, message):
        self.lines.append(message)


class LoopHarness:
    """The loop's trainer: the session at its five points (guard/host.py)."""

    def __init__(self, run_dir: Path, guard: dict[str, Any], resume: bool = False) -> None:
        self.run_dir, self.guard = run_dir, guard
        self.loop = Loop(run_dir)
        self.host = LoopHost(self.loop)
        kl = KLSetup(target_kl=0.01, kl_coef=self.loop.kl_ctrl.value)
        self.session = GuardSession.build(GuardConfig(**guard), self.host, total_steps=20, kl=kl, keys=KEYS)
        if resume:
            newest = max(int(p.name.split("_")[1]) for p in run_dir.glob("ckpt_*"))
            self.loop.load(newest)
            own = self.session.load_state_dict(GuardSession.read_state(self.loop.folder(newest) / "guard.json"))
            self.loop.kl_ctrl.load_state_dict(own["controller"])
        else:
            self.session.observe(0, {})  # the warm-up's freeze of step 1

    def run(self, step: int, kl: float = 0.01, *, save: bool = False) -> None:
        coef = self.loop.kl_ctrl.value
        self.loop.weights = {"trained_to": step}
        self.session.update_kl(kl, 256, self.loop.kl_ctrl)
        metrics = {REF_KL: kl, KL_COEF: coef, PPO_KL: 0.001, SCORE: 0.5, LENGTH: 10.0, ENTROPY: 1.0}
        self.session.observe(step, metrics)
        if save:
            self.loop.save(step, self.session.checkpoint(step, controller=self.loop.kl_ctrl.state_dict()))

    def coefficient(self) -> float:
        return self.loop.kl_ctrl.value

    def restored(self) -> list[int]:
        return self.host.restored

    def paused(self) -> bool:
        return self.loop.stop

    def said(self) -> list[str]:
        return self.host.lines

    def events(self) -> list[dict[str, Any]]:
        return self.host.events

    def written_state(self, step: int) -> dict[str, Any]:
        return GuardSession.read_state(self.loop.folder(step) / "guard.json")

    def resume(self) -> LoopHarness:
        return LoopHarness(self.run_dir, self.guard, resume=True)


@pytest.mark.parametrize("check", CHECKS, ids=lambda check: check.__name__.removeprefix("check_"))
def test_a_fifth_host_passes_the_sessions_host_tests(check, tmp_path):
    check(lambda run="run", **guard: LoopHarness(tmp_path / run, guard))
