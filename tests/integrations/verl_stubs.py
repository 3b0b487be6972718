"""verl's trainer with stubs for what needs GPUs (its worker groups and rollout replicas): a helper module of the verl
plugin's tests, which run verl's own config, `_save_checkpoint` and `_load_checkpoint`."""

from __future__ import annotations

import os
from pathlib import Path

from hydra import compose, initialize_config_dir

from klguard.integrations.verl.trainer import KLGuardTrainer


class WorkerGroup:
    """verl's actor/critic worker group as the trainer calls it: records calls, writes the checkpoint folder."""

    def __init__(self) -> None:
        self.loaded: list[str] = []

    def save_checkpoint(self, local_path, remote_path, global_step, max_ckpt_to_keep=None):
        Path(local_path).mkdir(parents=True, exist_ok=True)
        (Path(local_path) / "weights.txt").write_text(str(global_step))

    def load_checkpoint(self, local_path, del_local_after_load=False):
        self.loaded.append(str(local_path))


class Replicas:
    def __init__(self) -> None:
        self.synced: list[int] = []

    def update_weights(self, global_steps):
        self.synced.append(global_steps)


class Loader:
    def state_dict(self):
        return {"position": 1}

    def load_state_dict(self, state):
        self.state = state


def verl_config(tmp_path, *overrides):
    """verl's config, the KL in the reward steered by an adaptive controller from 0.05, checkpoints in tmp_path."""
    import verl

    root = os.path.join(os.path.dirname(verl.__file__), "trainer", "config")
    with initialize_config_dir(config_dir=root, version_base=None):
        return compose(config_name="ppo_trainer", overrides=[
            "algorithm.use_kl_in_reward=True", "algorithm.kl_ctrl.type=adaptive", "algorithm.kl_ctrl.kl_coef=0.05",
            "trainer.v1.trainer_mode=klguard", f"trainer.default_local_dir={tmp_path / 'ckpt'}",
            "actor_rollout_ref.rollout.name=vllm", *overrides])


def trainer_with_stubs(config) -> KLGuardTrainer:
    trainer = KLGuardTrainer(config)
    trainer.actor_rollout_wg, trainer.critic_wg = WorkerGroup(), WorkerGroup()
    trainer.checkpoint_manager, trainer.train_dataloader = Replicas(), Loader()
    trainer.total_training_steps, trainer.global_steps = 20, 0
    return trainer
