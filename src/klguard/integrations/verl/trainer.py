"""Trainer mode `klguard`: verl 0.9.1's synchronous PPO trainer with klguard's guard after each step."""

from __future__ import annotations

from omegaconf import open_dict
from verl.trainer.ppo.v1.trainer_base import register_trainer
from verl.trainer.ppo.v1.trainer_sync import PPOTrainerSync

from klguard.integrations.verl.host import VerlHost, apply_relaunch_settings, say_prerequisites

MODE = "klguard"


@register_trainer(MODE)
class KLGuardTrainer(PPOTrainerSync):
    """`trainer.v1.trainer_mode=klguard`. verl's loop is unchanged; after each step's metrics are computed (the
    dict verl is about to log) the guard decides and acts, and its `guard/*` metrics join the logged ones."""

    def __init__(self, config):
        with open_dict(config):
            config.trainer.v1.trainer_mode = "sync"  # verl's base class tests for the literal "sync"
        apply_relaunch_settings(config)
        say_prerequisites(config)  # what the guard cannot do with these settings, one line each
        super().__init__(config)
        self.klguard: VerlHost | None = None

    def _guard(self) -> VerlHost:
        if self.klguard is None:  # total_training_steps is known once verl built its dataloader
            self.klguard = VerlHost(self.config, int(getattr(self, "total_training_steps", 0) or 0))
        return self.klguard

    def _load_checkpoint(self):
        super()._load_checkpoint()
        if self.global_steps > 0:
            self._guard().on_resume(self)

    def _save_checkpoint(self):
        super()._save_checkpoint()
        self._guard().on_save(self)

    def _compute_metrics(self, batch, metrics, timing_raw, global_steps, epoch):
        super()._compute_metrics(batch, metrics, timing_raw, global_steps, epoch)
        metrics.update(self._guard().after_step(self, global_steps, metrics))
