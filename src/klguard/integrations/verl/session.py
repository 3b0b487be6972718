"""The guard of one verl run: its settings from the launch line, what it decides after each step, what each
decision does to verl's trainer, and its state beside each of verl's checkpoints.

What acts live and what waits for a relaunch (verl 0.9.1 has no worker call for the lr, the KL-loss
coefficient or the gradient clip; a relaunch resumes with them, see `relaunch_settings`):
- in-reward KL coefficient (`algorithm.use_kl_in_reward=true`): `trainer.kl_ctrl_in_reward.value`, live;
  `lower_target_kl` sets the adaptive controller's target, live;
- rollback: the newest stable `global_step_N` through verl's own worker calls (`load_checkpoint` of the actor and
  the critic), then a weight sync to the rollout replicas (`checkpoint_manager.update_weights`), live;
- pause: a checkpoint (unless this step saved one), then the loop ends after this step, live;
- KL-loss coefficient, lr, gradient clip: saved, applied to the config at the next relaunch (the message says
  which keys); re-anchoring the reference is not done in verl (the reference worker keeps its weights).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf, open_dict

from klguard.config.restricted import load_restricted
from klguard.config.schema import Config
from klguard.guard import Action, KLGuard
from klguard.runtime.events import append_event

STATE_FILE = "klguard_state.json"
STATE_VERSION = 1
KEY_PREFIXES = ("guard.",)


def guard_settings(verl_config: DictConfig) -> Config:
    """klguard's keys from the launch line's `+klguard.*` block (`+klguard.guard.kl_hard_limit=0.2`)."""
    block = verl_config.get("klguard") or {}
    tree = OmegaConf.to_container(block, resolve=True) if OmegaConf.is_config(block) else dict(block)
    overrides = [f"{key}={json.dumps(value)}" for key, value in _flatten(tree)]
    return load_restricted(overrides, KEY_PREFIXES, who="the verl plugin (+klguard.*)",
                           elsewhere="verl's own keys (algorithm.kl_ctrl.*, ...) stay verl's")


def _flatten(tree: Mapping, prefix: str = ""):
    for key, value in tree.items():
        if isinstance(value, Mapping):
            yield from _flatten(value, f"{prefix}{key}.")
        else:
            yield f"{prefix}{key}", value


class GuardSession:
    """Holds KLGuard and the checkpoint bookkeeping for one verl trainer (`trainer`: verl's PPOTrainer)."""

    def __init__(self, verl_config: DictConfig, total_steps: int) -> None:
        settings = guard_settings(verl_config)
        algo = verl_config.algorithm
        self.in_reward = bool(algo.use_kl_in_reward)
        actor = verl_config.actor_rollout_ref.actor
        coef = float(algo.kl_ctrl.kl_coef) if self.in_reward else float(actor.kl_loss_coef)
        self.guard = KLGuard(settings.guard, total_steps=total_steps, target_kl=float(algo.kl_ctrl.target_kl),
                             kl_coef=coef, kl_controlled=self.in_reward and algo.kl_ctrl.type != "fixed")
        self.run_dir = Path(verl_config.trainer.default_local_dir)
        self.events = self.run_dir / "events.jsonl"
        self.stable: list[int] = []  # checkpoint steps a later step found calm
        self.pending: int | None = None  # a checkpoint saved, stable once the next step finds its weights calm
        self.saved_at: int | None = None  # the step whose checkpoint exists (pause saves none twice)
        self.held: float | None = None  # the warm-up's frozen in-reward coefficient
        self.relaunch: dict[str, float] = {}  # verl keys the next launch should carry
        self.last_rollback: int | None = None

    # ------------------------------------------------------------------ the step
    def after_step(self, trainer, step: int, metrics: dict[str, float]) -> dict[str, float]:
        """Decide on step `step`'s metrics (verl's names, as logged) and act; the guard/* metrics to log."""
        if self.held is not None and self.in_reward:
            trainer.kl_ctrl_in_reward.value = self.held
        numbers = {k: float(v) for k, v in metrics.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}
        for action in self.guard.observe(step, numbers):
            self.apply(trainer, action)
        calm = self.guard.is_stable() and self.last_rollback != step
        if self.pending is not None and self.pending < step and calm:  # this step's rollout used its weights
            self.stable.append(self.pending)
        if self.pending is not None and self.pending < step:
            self.pending = None
        if self.saved_at == step and self.last_rollback != step:
            self.pending = step  # verl saves during the step, before its metrics: the next step judges it
        if self.saved_at == step:
            self._write_state(trainer)  # again, now with this step's decisions: a resume continues from here
        return self.guard.guard_metrics()

    def apply(self, trainer, action: Action) -> None:
        append_event(self.events, action.to_dict(), who="klguard guard (verl)")
        kind = action.kind
        if kind == "raise_kl_coef" or (kind in ("freeze_kl_coef", "release_kl_coef") and action.new is not None):
            self._set_kl_coef(trainer, action)
        if kind == "freeze_kl_coef":
            self.held = action.new
        elif kind == "release_kl_coef":
            self.held = None
        elif kind == "lower_target_kl" and self.in_reward and hasattr(trainer.kl_ctrl_in_reward, "target"):
            trainer.kl_ctrl_in_reward.target = action.new
        elif kind == "cut_lr":
            lr = float(trainer.config.actor_rollout_ref.actor.optim.lr)
            self._for_relaunch("actor_rollout_ref.actor.optim.lr", lr * self.guard.lr_scale)
        elif kind == "set_grad_clip":
            self._for_relaunch("actor_rollout_ref.actor.optim.clip_grad", action.new)
        elif kind == "rollback":
            self._rollback(trainer, action.step)
        elif kind == "pause":
            self._pause(trainer, action)
        elif kind == "reanchor_reference":
            _say("klguard: verl's reference worker keeps its weights: the reference is not re-anchored")

    def _set_kl_coef(self, trainer, action: Action) -> None:
        if self.in_reward:
            trainer.kl_ctrl_in_reward.value = float(action.new)
        else:
            self._for_relaunch("actor_rollout_ref.actor.kl_loss_coef", action.new)

    def _for_relaunch(self, key: str, value: float) -> None:
        self.relaunch[key] = float(value)
        _say(f"klguard: {key}={value:.4g} applies at the next launch (verl has no live path for it); the plugin "
             "sets it when the run resumes from a checkpoint")

    def _rollback(self, trainer, step: int) -> None:
        if not self.stable:
            _say(f"klguard: no stable checkpoint to roll back to at step {step}: pausing instead")
            self._pause(trainer, None)
            return
        target = self.stable[-1]
        folder = self.run_dir / f"global_step_{target}"
        trainer.actor_rollout_wg.load_checkpoint(local_path=str(folder / "actor"), del_local_after_load=False)
        if trainer.use_critic:
            trainer.critic_wg.load_checkpoint(local_path=str(folder / "critic"), del_local_after_load=False)
        trainer.checkpoint_manager.update_weights(trainer.global_steps)  # the rollout replicas get the old weights
        self.last_rollback = step
        self.pending = None
        _say(f"klguard: rolled back to {folder} at step {step}")
        for action in self.guard.on_rollback(target):
            self.apply(trainer, action)

    def _pause(self, trainer, action: Action | None) -> None:
        if self.saved_at != trainer.global_steps:
            trainer._save_checkpoint()
        trainer.total_training_steps = trainer.global_steps  # fit() ends after this step
        why = action.reason if action is not None else "no stable checkpoint to roll back to"
        _say(f"klguard: paused at step {trainer.global_steps}: {why}; resume with the same launch line")

    # ------------------------------------------------------------------ checkpoints
    def on_save(self, trainer) -> None:
        """Called after verl saved global_step_N (during step N): the guard's state goes beside it, and is
        written again once step N's metrics are decided on."""
        self.saved_at = trainer.global_steps
        self._write_state(trainer)

    def _write_state(self, trainer) -> None:
        folder = self.run_dir / f"global_step_{trainer.global_steps}"
        ctrl = getattr(trainer, "kl_ctrl_in_reward", None)
        state = {"version": STATE_VERSION, "guard": self.guard.state_dict(), "stable": self.stable,
                 "pending": self.pending, "held": self.held, "relaunch": self.relaunch,
                 "kl_ctrl": None if ctrl is None else {"value": ctrl.value, "target": getattr(ctrl, "target", None)}}
        tmp = folder / (STATE_FILE + ".tmp")
        tmp.write_text(json.dumps(state, sort_keys=True))
        tmp.replace(folder / STATE_FILE)

    def on_resume(self, trainer) -> None:
        """After verl restored global_step_N: the guard, the stable list and the KL controller as they were."""
        state = self.read_state(self.run_dir / f"global_step_{trainer.global_steps}")
        if state is None:
            return
        self.guard.load_state_dict(state["guard"])
        self.stable, self.pending, self.held = list(state["stable"]), state["pending"], state["held"]
        self.relaunch = dict(state["relaunch"])
        ctrl = state["kl_ctrl"]
        if ctrl is not None and getattr(trainer, "kl_ctrl_in_reward", None) is not None:
            trainer.kl_ctrl_in_reward.value = ctrl["value"]
            if ctrl["target"] is not None and hasattr(trainer.kl_ctrl_in_reward, "target"):
                trainer.kl_ctrl_in_reward.target = ctrl["target"]

    @staticmethod
    def read_state(folder: Path) -> dict[str, Any] | None:
        file = folder / STATE_FILE
        if not file.is_file():
            return None
        state = json.loads(file.read_text())
        if state.get("version") != STATE_VERSION:
            raise ValueError(f"{file}: klguard state version {state.get('version')!r} is not {STATE_VERSION}")
        return state


def apply_relaunch_settings(verl_config: DictConfig) -> list[str]:
    """Before verl builds its workers: the settings the guard chose for the next launch, read from the checkpoint
    the run resumes from (trainer.resume_mode auto: the latest). Returns what was set."""
    if verl_config.trainer.resume_mode == "disable":
        return []
    run_dir = Path(verl_config.trainer.default_local_dir)
    latest = run_dir / "latest_checkpointed_iteration.txt"
    if verl_config.trainer.resume_mode == "resume_path" and verl_config.trainer.resume_from_path:
        folder = Path(verl_config.trainer.resume_from_path)
    elif latest.is_file():
        folder = run_dir / f"global_step_{latest.read_text().strip()}"
    else:
        return []
    state = GuardSession.read_state(folder)
    done = []
    with open_dict(verl_config):
        for key, value in ((state or {}).get("relaunch") or {}).items():
            OmegaConf.update(verl_config, key, value)
            done.append(f"{key}={value:.4g}")
    if done:
        _say(f"klguard: set from the guard's decisions before the relaunch: {', '.join(done)}")
    contents = list(verl_config.actor_rollout_ref.actor.checkpoint.get("load_contents") or [])
    if any(d.startswith("actor_rollout_ref.actor.optim.lr=") for d in done) and "extra" in contents:
        _say("klguard: verl restores the lr scheduler from the checkpoint: the lower lr applies only with "
             "actor_rollout_ref.actor.checkpoint.load_contents=[model,optimizer]")
    return done


def _say(message: str) -> None:
    from tqdm import tqdm

    tqdm.write(message)
