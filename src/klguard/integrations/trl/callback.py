"""KLGuardCallback: klguard's KL controller and guard inside TRL's GRPOTrainer.

    trainer = GRPOTrainer(model=..., reward_funcs=[proxy, gold], args=GRPOConfig(beta=0.001, logging_steps=1,
                          reward_weights=[1.0, 0.0], save_steps=10, ...), ...)
    trainer.add_callback(KLGuardCallback(trainer, ["algorithm.kl_ctrl.type=pid", "trl.gold_reward=gold"]))
    trainer.train()

At every step's log (``on_log``, step N) the callback maps TRL's metrics to the guard's names, updates the
KL controller from TRL's ``kl``, feeds the guard session (klguard.guard.session) and carries out its actions before
step N+1 (`TRLHost`): beta (``trainer.beta``), the learning rates (param groups and the scheduler's base
rates), gradient clipping (``args.max_grad_norm``), a rollback to the newest stable checkpoint, re-anchoring the
reference, a pause (a checkpoint, then a clean stop). The session's state (guard, KL controller, stable
checkpoints) travels in each checkpoint's ``trainer_state.json`` (transformers' ExportableState), so
``resume_from_checkpoint`` takes the same decisions as an uninterrupted run. ``events.jsonl`` in
``args.output_dir`` lists every action.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from tqdm import tqdm
from transformers import TrainerCallback
from transformers.trainer_callback import ExportableState

from klguard.algo.kl import build_kl_controller
from klguard.guard import GuardSession, HostKeys, KLGuard
from klguard.guard.signals import REF_KL_LOSS
from klguard.integrations.gold import GoldWindow
from klguard.integrations.metric_maps import guard_names, to_klguard_names
from klguard.integrations.trl import trainer_ops
from klguard.integrations.trl.settings import check_trainer, load_settings
from klguard.runtime.events import append_event, truncate_logs

STATE_VERSION = 1
TRL_KEYS = HostKeys(kl_coef="GRPOConfig beta", lr="learning_rate", save_freq="save_steps",
                    resume="resume_from_checkpoint")


class KLGuardCallback(TrainerCallback, ExportableState):
    """The guard of one GRPOTrainer run. ``overrides``: klguard's dotted keys under ``guard.``,
    ``algorithm.kl_ctrl.`` and ``trl.`` (``"guard.kl_hard_limit=0.2"``); bad ones raise one-line ConfigErrors."""

    def __init__(self, trainer, overrides: Sequence[str] | None = None) -> None:
        self.trainer = trainer
        self.settings = load_settings(list(overrides or ()))
        check_trainer(trainer, self.settings)
        kc = self.settings.kl_ctrl
        # TRL's beta is a constant: the session owns the controller that moves it
        self.controller = build_kl_controller(kc.type, trainer.beta, target_kl=kc.target_kl, horizon=kc.horizon,
                                              kp=kc.kp, ki=kc.ki, kd=kc.kd)
        self.host = TRLHost(trainer)
        self.session: GuardSession | None = None  # built once TRL knows the run's length
        self.gold = GoldWindow(self.settings.trl.gold_window)
        self.eval_gold: float | None = None  # an evaluation's gold, given to the guard with the next step

    @property
    def pause_reason(self) -> str | None:
        return None if self.session is None else self.session.pause_reason

    # ------------------------------------------------------------------ TRL's events
    def on_train_begin(self, args, state, control, **kwargs):
        self._run_first()
        kc = self.settings.kl_ctrl
        guard = KLGuard(self.settings.guard, total_steps=state.max_steps, target_kl=kc.target_kl,
                        kl_coef=self.trainer.beta, kl_controlled=kc.type != "fixed")
        self.session = GuardSession(guard, self.host, TRL_KEYS, self.controller)
        self.host.control = control
        saved = (state.stateful_callbacks or {}).get(type(self).__name__)
        if state.global_step > 0:
            self._resume(state, saved)
        else:
            self.session.observe(0, {})  # the warm-up freeze of step 1, if configured
        self.trainer.beta = self.controller.value
        return control

    def on_log(self, args, state, control, logs=None, **kwargs):
        if logs is None or self.session is None:
            return control
        if any(key.startswith("eval_") for key in logs):
            self._take_eval(logs)
            return control
        if "loss" not in logs:  # the end-of-training summary
            return control
        step, beta = state.global_step, self.trainer.beta
        metrics = self._guard_inputs(logs, beta)
        kl = metrics.get(REF_KL_LOSS)
        if kl is not None:
            self.session.update_kl(kl, n_steps=self._batch_rows())
        self.host.control = control
        self.session.observe(step, metrics)
        self.trainer.beta = self.controller.value
        extra = self.session.guard_metrics() | {"beta": beta}
        extra |= {k: v for k, v in metrics.items() if k.startswith(("hacking/", "guard/gold"))}
        logs.update(extra)
        if state.log_history and state.log_history[-1].get("step") == step:
            state.log_history[-1].update(extra)  # trainer_state.json: what `klguard report` reads
        return control

    def on_save(self, args, state, control, **kwargs):
        if self.session is not None:  # every process: the next step judges this checkpoint
            self.session.pending = state.global_step
        return control

    # ------------------------------------------------------------------ state
    def state(self) -> dict:
        """Saved in each checkpoint's trainer_state.json (transformers calls this just before on_save, on the
        process that writes it)."""
        if self.session is None:
            return {"args": {}, "attributes": {}}
        self.session.pending = self.trainer.state.global_step  # the checkpoint being written: a resume judges it
        return {"args": {}, "attributes": {"klguard": {
            "version": STATE_VERSION, **self.session.state_dict(), "gold": self.gold.state_dict(),
            "eval_gold": self.eval_gold}}}

    def _resume(self, state, saved: dict | None) -> None:
        found = (saved or {}).get("attributes", {}).get("klguard")
        if not found:
            tqdm.write(f"klguard: the checkpoint of step {state.global_step} holds no klguard state: the guard and "
                       "the KL controller start afresh")
            return
        if found.get("version") != STATE_VERSION:
            raise ValueError(f"klguard state version {found.get('version')!r} in trainer_state.json is not "
                             f"{STATE_VERSION}: resume with the klguard that wrote it")
        self.session.load_state_dict(found)
        self.gold.load_state_dict(found["gold"])
        self.eval_gold = found["eval_gold"]
        if self.session.guard.grad_clip is not None:  # args.max_grad_norm comes from the launch, not the checkpoint
            trainer_ops.set_grad_clip(self.trainer, self.session.guard.grad_clip)
        if state.is_world_process_zero:
            truncate_logs(self.host.output_dir, state.global_step)  # events a killed run wrote after it

    # ------------------------------------------------------------------ inputs
    def _guard_inputs(self, logs: dict[str, Any], beta: float) -> dict[str, float]:
        metrics = to_klguard_names(logs, "trl") | {"actor/kl_coef": float(beta)}
        # a NaN gradient norm, loss or score is news to the guard's nonfinite rule (never to the KL controller)
        nonfinite = {k: v for k, v in logs.items() if isinstance(v, float) and not math.isfinite(v)}
        metrics |= {k: v for k, v in guard_names(nonfinite, "trl").items() if k != REF_KL_LOSS}
        gold_name = self.settings.trl.gold_reward
        if gold_name is None:
            return metrics
        gold = metrics.get(f"rewards/{gold_name}/mean")
        if gold is not None:
            metrics["hacking/gold_score"] = gold
        if "critic/score/mean" in metrics:
            metrics["hacking/proxy_score"] = metrics["critic/score/mean"]
        val = self.gold.add(gold) if self.settings.trl.gold_source == "train" else self.eval_gold
        self.eval_gold = None
        if val is not None:
            metrics[f"val-core/{gold_name}/acc/mean"] = metrics["guard/gold_validation"] = val
        return metrics

    def _take_eval(self, logs: dict[str, Any]) -> None:
        gold_name = self.settings.trl.gold_reward
        if gold_name is None or self.settings.trl.gold_source != "eval":
            return
        value = logs.get(f"eval_rewards/{gold_name}/mean")
        if isinstance(value, (int, float)) and math.isfinite(value):
            self.eval_gold = float(value)

    def _batch_rows(self) -> int:
        """Completions per optimizer step over all processes (the adaptive controller's n_steps)."""
        args = self.trainer.args
        return args.per_device_train_batch_size * args.gradient_accumulation_steps * args.world_size

    # ------------------------------------------------------------------ order
    def _run_first(self) -> None:
        """Move this callback to the front of the trainer's list, so the loggers that run after it (TensorBoard,
        W&B, trackio) see the guard/* metrics it adds to each step's logs. Safe inside the on_train_begin loop:
        the callbacks before this one have run, the ones after it keep their turn."""
        handler = self.trainer.callback_handler.callbacks
        if handler.index(self) == 0:
            return
        handler.remove(self)
        handler.insert(0, self)


class TRLHost:
    """The guard's actions on a live GRPOTrainer (klguard.guard.GuardHost). Every process applies them (they follow
    from the same gathered metrics); the main process writes and prints them. ``control``: the TrainerControl of
    the event being handled."""

    def __init__(self, trainer) -> None:
        self.trainer = trainer
        self.output_dir = Path(trainer.args.output_dir)
        self.events_path = self.output_dir / "events.jsonl"
        self.control = None

    def set_kl_coef(self, value: float | None, *, frozen: bool) -> None:
        if value is not None:  # the session's controller holds it, frozen or not
            self.trainer.beta = value

    def set_target_kl(self, value: float) -> None:
        pass  # the session's controller took it

    def set_lr_scale(self, scale: float, ratio: float) -> None:
        trainer_ops.scale_lr(self.trainer, ratio)

    def set_grad_clip(self, clip: float) -> None:
        trainer_ops.set_grad_clip(self.trainer, clip)

    def restore_checkpoint(self, step: int) -> int | None:
        folder = self.output_dir / f"checkpoint-{step}"
        if not folder.is_dir():  # save_total_limit deleted it
            return None
        trainer_ops.restore_checkpoint(self.trainer, folder)
        self.say(f"klguard: rolled back to {folder}")
        return step

    def restore_reference(self, reference_step: int) -> int | None:
        if not trainer_ops.can_restore_reference(self.trainer):
            return None
        trainer_ops.restore_reference(self.trainer)
        self.say(f"klguard: rolled back to the reference policy (step {reference_step}; no stable checkpoint on "
                 "disk: set save_steps to give the guard rollback targets)")
        return reference_step

    def reanchor_reference(self, step: int) -> None:
        if not trainer_ops.reanchor_reference(self.trainer):
            self.say("klguard: this trainer has no separate reference model (PEFT): not re-anchored")

    def pause(self, reason: str) -> None:
        self.control.should_save = True
        self.control.should_training_stop = True
        self.say(f"klguard: paused at step {self.trainer.state.global_step}: {reason}")

    def write_event(self, record: dict[str, Any]) -> None:
        if self.trainer.state.is_world_process_zero:
            append_event(self.events_path, record)

    def say(self, message: str) -> None:
        if self.trainer.state.is_world_process_zero:
            tqdm.write(message)
