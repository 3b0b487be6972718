"""verl's trainer as the host of the guard's session (klguard.guard.session decides, keeps the stable checkpoints and
the versioned state): the guard's settings from the launch line, what each decision does to verl's trainer, how
verl's keys are spelt, and the session's state beside each of verl's checkpoints.

What acts live and what waits for a relaunch (verl 0.9.1 has no worker call for the lr, the KL-loss
coefficient or the gradient clip; a relaunch resumes with them, see `relaunch_settings`):
- in-reward KL coefficient (`algorithm.use_kl_in_reward=true`): `trainer.kl_ctrl_in_reward.value`, live;
  `lower_target_kl` sets the adaptive controller's target, live;
- rollback: the newest stable `global_step_N` still on disk through verl's own worker calls (`load_checkpoint` of
  the actor and the critic), then a weight sync to the rollout replicas (`checkpoint_manager.update_weights`),
  live; with none, a pause;
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

from klguard.config.restricted import load_restricted, with_host_defaults
from klguard.config.roles import kl_coef_key, kl_setup
from klguard.config.schema import Config
from klguard.guard import GuardSession, HostKeys
from klguard.guard.config import EXTERNAL_HOST_DEFAULTS
from klguard.integrations.verl.prerequisites import missing_prerequisites
from klguard.runtime.events import append_event

STATE_FILE = "klguard_state.json"
KEY_PREFIXES = ("guard.",)
LR_KEY = "actor_rollout_ref.actor.optim.lr"


def guard_settings(verl_config: DictConfig) -> Config:
    """klguard's keys from the launch line's `+klguard.*` block (`+klguard.guard.kl_hard_limit=0.8`)."""
    block = verl_config.get("klguard") or {}
    tree = OmegaConf.to_container(block, resolve=True) if OmegaConf.is_config(block) else dict(block)
    overrides = [f"{key}={json.dumps(value)}" for key, value in _flatten(tree)]
    overrides = with_host_defaults(overrides, EXTERNAL_HOST_DEFAULTS)  # another trainer's model: not the built-in's
    return load_restricted(overrides, KEY_PREFIXES, who="the verl plugin (+klguard.*)",
                           elsewhere="verl's own keys (algorithm.kl_ctrl.*, ...) stay verl's")


def _flatten(tree: Mapping, prefix: str = ""):
    for key, value in tree.items():
        if isinstance(value, Mapping):
            yield from _flatten(value, f"{prefix}{key}.")
        else:
            yield f"{prefix}{key}", value


class VerlHost:
    """The guard session of one verl trainer (`trainer`: verl's PPOTrainer, given with each call), and its host
    (klguard.guard.GuardHost): what each action does to verl, live or at the next launch."""

    def __init__(self, verl_config: DictConfig, total_steps: int) -> None:
        settings = guard_settings(verl_config)
        self.in_reward = bool(verl_config.algorithm.use_kl_in_reward)  # else the KL loss's coefficient is steered
        keys = HostKeys(kl_coef=kl_coef_key(verl_config, loss_steered=False), lr=LR_KEY, save_freq="trainer.save_freq",
                        resume="relaunch with the same launch line", guard="+klguard.guard.")
        self.session = GuardSession.build(settings.guard, self, total_steps=total_steps,
                                          kl=kl_setup(verl_config, loss_steered=False), keys=keys)
        self.run_dir = Path(verl_config.trainer.default_local_dir)
        self.events = self.run_dir / "events.jsonl"
        self.trainer = None
        self.saved_at: int | None = None  # the step whose checkpoint exists (pause saves none twice)
        self.relaunch: dict[str, float] = {}  # verl keys the next launch should carry

    # ------------------------------------------------------------------ the step
    def after_step(self, trainer, step: int, metrics: dict[str, float]) -> dict[str, float]:
        """Decide on step `step`'s metrics (verl's names, as logged) and act; the guard/* metrics to log."""
        self.trainer = trainer
        held = self.session.held_kl_coef  # verl's controller moved during the step: the warm-up's hold again
        if held is not None and self.in_reward:
            trainer.kl_ctrl_in_reward.value = held
        numbers = {k: float(v) for k, v in metrics.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}
        self.session.observe(step, numbers)
        if self.saved_at == step:
            self._write_state(trainer)  # again, now with this step's decisions: a resume continues from here
        return self.session.guard_metrics()

    # ------------------------------------------------------------------ the host (klguard.guard.GuardHost)
    def set_kl_coef(self, value: float | None, *, frozen: bool) -> None:
        if value is None:
            return
        if self.in_reward:
            self.trainer.kl_ctrl_in_reward.value = float(value)
        else:
            self._for_relaunch("actor_rollout_ref.actor.kl_loss_coef", value)

    def set_target_kl(self, value: float) -> None:
        if self.in_reward and hasattr(self.trainer.kl_ctrl_in_reward, "target"):
            self.trainer.kl_ctrl_in_reward.target = value

    def set_lr_scale(self, scale: float, ratio: float) -> None:
        lr = float(self.trainer.config.actor_rollout_ref.actor.optim.lr)
        self._for_relaunch(LR_KEY, lr * scale)

    def set_grad_clip(self, clip: float) -> None:
        self._for_relaunch("actor_rollout_ref.actor.optim.clip_grad", clip)

    def restore_checkpoint(self, step: int) -> int | None:
        """verl's own worker calls load the actor (and critic), then the rollout replicas get the old weights."""
        trainer, folder = self.trainer, self.run_dir / f"global_step_{step}"
        if not folder.is_dir():  # max_actor_ckpt_to_keep deleted it
            return None
        trainer.actor_rollout_wg.load_checkpoint(local_path=str(folder / "actor"), del_local_after_load=False)
        if trainer.use_critic:
            trainer.critic_wg.load_checkpoint(local_path=str(folder / "critic"), del_local_after_load=False)
        trainer.checkpoint_manager.update_weights(trainer.global_steps)
        self.say(f"klguard: rolled back to {folder} at step {trainer.global_steps}")
        return step

    def restore_reference(self, reference_step: int) -> int | None:
        return None  # verl's reference worker holds the weights, and no call copies them into the actor

    def reanchor_reference(self, step: int) -> None:
        self.say("klguard: verl's reference worker keeps its weights: the reference is not re-anchored")

    def pause(self, reason: str) -> None:
        trainer = self.trainer
        if self.saved_at != trainer.global_steps:
            trainer._save_checkpoint()
        trainer.total_training_steps = trainer.global_steps  # fit() ends after this step

    def write_event(self, record: dict[str, Any]) -> None:
        append_event(self.events, record, who="klguard guard (verl)")

    def say(self, message: str) -> None:
        _say(message)

    def _for_relaunch(self, key: str, value: float) -> None:
        self.relaunch[key] = float(value)
        self.say(f"klguard: {key}={value:.4g} applies at the next launch (verl has no live path for it); the "
                 "plugin sets it when the run resumes from a checkpoint")

    # ------------------------------------------------------------------ checkpoints
    def on_save(self, trainer) -> None:
        """Called after verl saved global_step_N (during step N, before its metrics): the guard's state goes beside
        it, and is written again once step N's metrics are decided on."""
        self.saved_at = trainer.global_steps
        self.session.checkpoint(trainer.global_steps)
        self._write_state(trainer)

    def _write_state(self, trainer) -> None:
        ctrl = getattr(trainer, "kl_ctrl_in_reward", None)
        own = {"relaunch": self.relaunch,
               "kl_ctrl": None if ctrl is None else {"value": ctrl.value, "target": getattr(ctrl, "target", None)}}
        folder = self.run_dir / f"global_step_{trainer.global_steps}"
        GuardSession.save_state(folder / STATE_FILE, self.session.state_dict(**own))

    def on_resume(self, trainer) -> None:
        """After verl restored global_step_N: the guard session, the settings for the next launch and verl's KL
        controller (which verl does not save) as they were."""
        state = GuardSession.read_state(self.run_dir / f"global_step_{trainer.global_steps}" / STATE_FILE)
        if state is None:
            return
        own = self.session.load_state_dict(state)
        self.relaunch = dict(own["relaunch"])
        ctrl = own["kl_ctrl"]
        if ctrl is not None and getattr(trainer, "kl_ctrl_in_reward", None) is not None:
            trainer.kl_ctrl_in_reward.value = ctrl["value"]
            if ctrl["target"] is not None and hasattr(trainer.kl_ctrl_in_reward, "target"):
                trainer.kl_ctrl_in_reward.target = ctrl["target"]


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
    state = GuardSession.read_state(folder / STATE_FILE)
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


def say_prerequisites(verl_config: DictConfig) -> list[str]:
    """At start: one line for each thing the guard cannot do with this run's verl settings (see prerequisites)."""
    lines = missing_prerequisites(verl_config)
    for line in lines:
        _say(line)
    return lines


def _say(message: str) -> None:
    from tqdm import tqdm

    tqdm.write(message)
