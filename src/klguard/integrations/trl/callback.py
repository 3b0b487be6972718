"""KLGuardCallback: klguard's KL controller and guard inside TRL's GRPOTrainer.

    trainer = GRPOTrainer(model=..., reward_funcs=[proxy, gold], args=GRPOConfig(beta=0.001, logging_steps=1,
                          reward_weights=[1.0, 0.0], save_steps=10, ...), ...)
    trainer.add_callback(KLGuardCallback(trainer, ["algorithm.kl_ctrl.type=pid", "trl.gold_reward=gold"]))
    trainer.train()

At every step's log (``on_log``, step N) the callback maps TRL's metrics to the guard's names, updates the KL
controller from TRL's ``kl``, feeds the guard session (klguard.guard.session), whose host
(klguard.integrations.trl.host.TRLHost) carries out its actions before step N+1: beta (``trainer.beta``), the
learning rates (param groups and the scheduler's base rates), gradient clipping (``args.max_grad_norm``), a rollback
to the newest stable checkpoint, re-anchoring the reference, a pause (a checkpoint, then a clean stop). The
session's state (guard, KL controller, stable checkpoints) travels in each checkpoint's ``trainer_state.json``
(transformers' ExportableState), so ``resume_from_checkpoint`` takes the same decisions as an uninterrupted run.
``events.jsonl`` in ``args.output_dir`` lists every action.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from tqdm import tqdm
from transformers import TrainerCallback
from transformers.trainer_callback import ExportableState

from klguard.algo.kl import build_kl_controller
from klguard.guard import GuardSession, KLSetup
from klguard.guard.signals import KL_LOSS_COEF, REF_KL_LOSS, SCORE
from klguard.integrations.gold import GoldWindow
from klguard.integrations.metric_maps import guard_names, to_klguard_names
from klguard.integrations.trl import trainer_ops
from klguard.integrations.trl.host import TRL_KEYS, TRLHost
from klguard.integrations.trl.settings import check_trainer, load_settings
from klguard.runtime.events import truncate_logs

__all__ = ["TRL_KEYS", "KLGuardCallback", "TRLHost"]


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
        kl = KLSetup(target_kl=kc.target_kl, kl_coef=self.trainer.beta, controlled=kc.type != "fixed")
        self.session = GuardSession.build(self.settings.guard, self.host, total_steps=state.max_steps, kl=kl,
                                          keys=TRL_KEYS, controller=self.controller)
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
        if self.session is not None:  # every process (state() ran on the one that writes): the next step judges it
            self.session.checkpoint(state.global_step)
        return control

    # ------------------------------------------------------------------ state
    def state(self) -> dict:
        """Saved in each checkpoint's trainer_state.json (transformers calls this just before on_save, on the
        process that writes it)."""
        if self.session is None:
            return {"args": {}, "attributes": {}}
        return {"args": {}, "attributes": {"klguard": self.session.checkpoint(
            self.trainer.state.global_step, gold=self.gold.state_dict(), eval_gold=self.eval_gold)}}

    def _resume(self, state, saved: dict | None) -> None:
        found = (saved or {}).get("attributes", {}).get("klguard")
        if not found:
            tqdm.write(f"klguard: the checkpoint of step {state.global_step} holds no klguard state: the guard and "
                       "the KL controller start afresh")
            return
        own = self.session.load_state_dict(found)
        self.gold.load_state_dict(own["gold"])
        self.eval_gold = own["eval_gold"]
        if self.session.guard.grad_clip is not None:  # args.max_grad_norm comes from the launch, not the checkpoint
            trainer_ops.set_grad_clip(self.trainer, self.session.guard.grad_clip)
        if state.is_world_process_zero:
            truncate_logs(self.host.output_dir, state.global_step)  # events a killed run wrote after it

    # ------------------------------------------------------------------ inputs
    def _guard_inputs(self, logs: dict[str, Any], beta: float) -> dict[str, float]:
        metrics = to_klguard_names(logs, "trl") | {KL_LOSS_COEF: float(beta)}
        # a NaN gradient norm, loss or score is news to the guard's nonfinite rule (never to the KL controller)
        nonfinite = {k: v for k, v in logs.items() if isinstance(v, float) and not math.isfinite(v)}
        metrics |= {k: v for k, v in guard_names(nonfinite, "trl").items() if k != REF_KL_LOSS}
        gold_name = self.settings.trl.gold_reward
        if gold_name is None:
            return metrics
        gold = metrics.get(f"rewards/{gold_name}/mean")
        if gold is not None:
            metrics["hacking/gold_score"] = gold
        if SCORE in metrics:
            metrics["hacking/proxy_score"] = metrics[SCORE]
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
