"""KLGuardCallback: klguard's KL controller and guard inside TRL's GRPOTrainer.

    trainer = GRPOTrainer(model=..., reward_funcs=[proxy, gold], args=GRPOConfig(beta=0.001, logging_steps=1,
                          reward_weights=[1.0, 0.0], save_steps=10, ...), ...)
    trainer.add_callback(KLGuardCallback(trainer, ["algorithm.kl_ctrl.type=pid", "trl.gold_reward=gold"]))
    trainer.train()

At every step's log (``on_log``, step N) the callback maps TRL's metrics to the guard's names, updates the
KL controller from TRL's ``kl``, feeds the guard and applies its actions before step N+1: beta
(``trainer.beta``), the learning rates (param groups and the scheduler's base rates), gradient clipping
(``args.max_grad_norm``), a rollback to the newest stable checkpoint, re-anchoring the reference, a pause
(a checkpoint, then a clean stop). A checkpoint becomes stable when the next step finds its weights calm,
as in klguard's trainer. The guard's and the controller's state travel in each checkpoint's
``trainer_state.json`` (transformers' ExportableState), so ``resume_from_checkpoint`` takes the same
decisions as an uninterrupted run. ``events.jsonl`` in ``args.output_dir`` lists every action.
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
from klguard.guard import Action, KLGuard
from klguard.guard.signals import REF_KL_LOSS
from klguard.integrations.gold import GoldWindow
from klguard.integrations.metric_maps import to_klguard_names
from klguard.integrations.trl import trainer_ops
from klguard.integrations.trl.settings import check_trainer, load_settings
from klguard.runtime.events import append_event, truncate_logs

STATE_VERSION = 1

PAUSE_HINTS = {
    "kl_hard": "raise GRPOConfig beta or guard.kl_hard_limit",
    "val_drop": "raise GRPOConfig beta, lower learning_rate or raise guard.val_drop_max",
    "ppo_kl": "lower learning_rate or raise guard.ppo_kl_max",
    "hacking": "raise GRPOConfig beta or set guard.hacking_action=raise_kl_coef",
}


class KLGuardCallback(TrainerCallback, ExportableState):
    """The guard of one GRPOTrainer run. ``overrides``: klguard's dotted keys under ``guard.``,
    ``algorithm.kl_ctrl.`` and ``trl.`` (``"guard.kl_hard_limit=0.2"``); bad ones raise one-line ConfigErrors."""

    def __init__(self, trainer, overrides: Sequence[str] | None = None) -> None:
        self.trainer = trainer
        self.settings = load_settings(list(overrides or ()))
        check_trainer(trainer, self.settings)
        kc = self.settings.kl_ctrl
        self.controller = build_kl_controller(kc.type, trainer.beta, target_kl=kc.target_kl, horizon=kc.horizon,
                                              kp=kc.kp, ki=kc.ki, kd=kc.kd)
        self.guard: KLGuard | None = None
        self.frozen = False  # the guard's warm-up holds beta
        self.stable: list[int] = []  # checkpoint steps whose weights a later step found calm
        self.pending: int | None = None  # the last checkpoint, stable once the next step confirms it
        self.gold = GoldWindow(self.settings.trl.gold_window)
        self.eval_gold: float | None = None  # an evaluation's gold, given to the guard with the next step
        self.pause_reason: str | None = None
        self.last_rollback_step: int | None = None
        self.events_path = Path(trainer.args.output_dir) / "events.jsonl"

    # ------------------------------------------------------------------ TRL's events
    def on_train_begin(self, args, state, control, **kwargs):
        self._run_first()
        kc = self.settings.kl_ctrl
        self.guard = KLGuard(self.settings.guard, total_steps=state.max_steps, target_kl=kc.target_kl,
                             kl_coef=self.trainer.beta, kl_controlled=kc.type != "fixed")
        saved = (state.stateful_callbacks or {}).get(type(self).__name__)
        if state.global_step > 0:
            self._resume(state, saved)
        else:
            for action in self.guard.observe(0, {}):  # the warm-up freeze of step 1, if configured
                self._apply(action, state, control)
        self.trainer.beta = self.controller.value
        return control

    def on_log(self, args, state, control, logs=None, **kwargs):
        if logs is None or self.guard is None:
            return control
        if any(key.startswith("eval_") for key in logs):
            self._take_eval(logs)
            return control
        if "loss" not in logs:  # the end-of-training summary
            return control
        step, beta = state.global_step, self.trainer.beta
        metrics = self._guard_inputs(logs, beta)
        kl = metrics.get(REF_KL_LOSS)
        if kl is not None and not self.frozen:
            self.controller.update(kl, n_steps=self._batch_rows())
        for action in self.guard.observe(step, metrics):
            self._apply(action, state, control)
        if self.pending is not None and self.guard.is_stable() and self.last_rollback_step != step:
            self.stable.append(self.pending)  # its weights were just measured and found calm
        self.pending = None
        self.trainer.beta = self.controller.value
        extra = self.guard.guard_metrics() | {"beta": beta}
        extra |= {k: v for k, v in metrics.items() if k.startswith(("hacking/", "guard/gold"))}
        logs.update(extra)
        if state.log_history and state.log_history[-1].get("step") == step:
            state.log_history[-1].update(extra)  # trainer_state.json: what `klguard report` reads
        return control

    def on_save(self, args, state, control, **kwargs):
        self.pending = state.global_step
        return control

    # ------------------------------------------------------------------ state
    def state(self) -> dict:
        """Saved in each checkpoint's trainer_state.json (transformers calls this just before on_save)."""
        if self.guard is None:
            return {"args": {}, "attributes": {}}
        step = self.trainer.state.global_step
        return {"args": {}, "attributes": {"klguard": {
            "version": STATE_VERSION, "guard": self.guard.state_dict(), "kl_ctrl": self.controller.state_dict(),
            "frozen": self.frozen, "stable": list(self.stable), "pending": step, "gold": self.gold.state_dict(),
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
        self.guard.load_state_dict(found["guard"])
        self.controller.load_state_dict(found["kl_ctrl"])
        self.frozen, self.stable, self.pending = bool(found["frozen"]), list(found["stable"]), found["pending"]
        self.gold.load_state_dict(found["gold"])
        self.eval_gold = found["eval_gold"]
        if self.guard.grad_clip is not None:
            trainer_ops.set_grad_clip(self.trainer, self.guard.grad_clip)
        if state.is_world_process_zero:
            truncate_logs(self.events_path.parent, state.global_step)  # events a killed run wrote after it

    # ------------------------------------------------------------------ inputs
    def _guard_inputs(self, logs: dict[str, Any], beta: float) -> dict[str, float]:
        metrics = to_klguard_names(logs, "trl") | {"actor/kl_coef": float(beta)}
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

    # ------------------------------------------------------------------ actions
    def _apply(self, action: Action, state, control) -> None:
        self._record(action, state)
        kind, trainer = action.kind, self.trainer
        if kind == "cut_lr":
            trainer_ops.scale_lr(trainer, action.new / action.old)
        elif kind in ("raise_kl_coef", "freeze_kl_coef"):
            self.controller.value = action.new
            self.frozen = self.frozen or kind == "freeze_kl_coef"
        elif kind == "release_kl_coef":
            self.frozen = False
            if action.new is not None:
                self.controller.value = action.new
        elif kind == "lower_target_kl" and hasattr(self.controller, "target_kl"):
            self.controller.target_kl = action.new
        elif kind == "set_grad_clip":
            trainer_ops.set_grad_clip(trainer, action.new)
        elif kind == "rollback":
            self._rollback(action, state, control)
        elif kind == "reanchor_reference" and not trainer_ops.reanchor_reference(trainer):
            self._say(state, "klguard: this trainer has no separate reference model (PEFT): not re-anchored")
        elif kind == "pause":
            hint = PAUSE_HINTS.get(action.rule, "adjust the guard.* threshold named above")
            self._pause(f"{action.reason} To go on: {hint}, then resume_from_checkpoint.", state, control)

    def _rollback(self, action: Action, state, control) -> None:
        self.last_rollback_step = action.step
        output_dir = Path(self.trainer.args.output_dir)
        folders = [output_dir / f"checkpoint-{s}" for s in reversed(self.stable)]
        folder = next((f for f in folders if f.is_dir()), None)
        if folder is not None:
            trainer_ops.restore_checkpoint(self.trainer, folder)
            restored = int(folder.name.rpartition("-")[2])
            self._say(state, f"klguard: rolled back to {folder}")
        elif trainer_ops.can_restore_reference(self.trainer):
            restored = self.guard.reference_step
            trainer_ops.restore_reference(self.trainer)
            self._say(state, f"klguard: rolled back to the reference policy (step {restored}; no stable checkpoint "
                      "on disk: set save_steps to give the guard rollback targets)")
        else:
            self._pause(f"{action.reason} No stable checkpoint is on disk and the reference cannot be restored: "
                        "paused instead (set save_steps).", state, control)
            return
        for follow_up in self.guard.on_rollback(restored):
            self._apply(follow_up, state, control)

    def _pause(self, reason: str, state, control) -> None:
        self.pause_reason = reason
        control.should_save = True
        control.should_training_stop = True
        self._say(state, f"klguard: paused at step {state.global_step}: {reason}")

    def _run_first(self) -> None:
        """Move this callback to the front of the trainer's list, so the loggers that run after it (TensorBoard,
        W&B, trackio) see the guard/* metrics it adds to each step's logs. Safe inside the on_train_begin loop:
        the callbacks before this one have run, the ones after it keep their turn."""
        handler = self.trainer.callback_handler.callbacks
        if handler.index(self) == 0:
            return
        handler.remove(self)
        handler.insert(0, self)

    def _record(self, action: Action, state) -> None:
        if not state.is_world_process_zero:
            return
        append_event(self.events_path, action.to_dict())

    @staticmethod
    def _say(state, message: str) -> None:
        if state.is_world_process_zero:
            tqdm.write(message)

