"""The verl plugin: registered through `verl.plugins`, built from verl 0.9.1's own composed config, and its
decisions and actions on verl's trainer. Only verl's worker groups and rollout replicas are stubs (they need
GPUs); checkpoint saving and resuming run verl's own `_save_checkpoint` / `_load_checkpoint`."""

from __future__ import annotations

import json
import os

import pytest

from klguard.errors import ConfigError

verl = pytest.importorskip("verl") if os.environ.get("CI") != "true" else __import__("verl")

from verl_stubs import trainer_with_stubs  # noqa: E402  (verl's config tool: after the verl check)
from verl_stubs import verl_config as stubbed_config  # noqa: E402

from klguard.integrations.verl.host import STATE_FILE  # noqa: E402
from klguard.integrations.verl.trainer import KLGuardTrainer  # noqa: E402


def verl_config(tmp_path, *overrides):
    """verl's config; the stubs' blow-ups are one step long, so the guard here rolls back on the first step above
    its KL limit (the plugin's own default waits for kl_hard_patience=3)."""
    return stubbed_config(tmp_path, *overrides, "+klguard.guard.kl_hard_patience=1")


def metrics(step: int, kl: float = 0.01) -> dict[str, float]:
    """A step's metrics under verl's names (apply_kl_penalty, the actor's and the data metrics)."""
    return {"actor/reward_kl_penalty": kl, "actor/reward_kl_penalty_coeff": 0.05, "actor/ppo_kl": 0.001,
            "critic/score/mean": 0.5, "actor/grad_norm": 1.0, "actor/entropy": 1.0, "response_length/mean": 10.0,
            "training/global_step": step}


def run_steps(trainer, last: int, blowup: int | None = None, save_freq: int = 2) -> list[dict]:
    logged = []
    for step in range(trainer.global_steps + 1, last + 1):
        trainer.global_steps = step
        if step % save_freq == 0:
            trainer._save_checkpoint()  # verl's: the step's checkpoint, before its metrics
        m = metrics(step, kl=5.0 if step == blowup else 0.01)
        m.update(trainer._guard().after_step(trainer, step, m))
        logged.append(m)
        if trainer.global_steps >= trainer.total_training_steps:
            break
    return logged


def test_the_entry_point_registers_trainer_mode_klguard():
    from importlib.metadata import entry_points

    from verl.trainer.ppo.v1 import get_trainer_cls
    from verl.trainer.ppo.v1.trainer_sync import PPOTrainerSync

    assert "klguard" in {ep.name for ep in entry_points(group="verl.plugins")}
    assert get_trainer_cls("klguard") is KLGuardTrainer and issubclass(KLGuardTrainer, PPOTrainerSync)


def test_built_from_verls_config_it_runs_as_verls_sync_trainer(tmp_path):
    trainer = trainer_with_stubs(verl_config(tmp_path, "+klguard.guard.kl_hard_limit=0.2"))
    assert trainer.trainer_mode == "sync"
    assert trainer._guard().session.guard.cfg.kl_hard_limit == 0.2
    cfg = trainer_with_stubs(verl_config(tmp_path))._guard().session.guard.cfg
    assert (cfg.kl_hard_limit, cfg.kl_hard_patience) == (0.5, 1)  # the external hosts' limit; the test's patience


def test_bad_klguard_keys_are_one_line(tmp_path):
    for override, message in (("+klguard.guard.kl_hard_limit=-1", "guard.kl_hard_limit=-1.0 must be > 0"),
                              ("+klguard.data.train_batch_size=8", "is not a key of the verl plugin")):
        with pytest.raises(ConfigError, match=message):
            trainer_with_stubs(verl_config(tmp_path, override))._guard()


def test_a_blowup_rolls_back_to_the_newest_stable_checkpoint_and_raises_beta(tmp_path):
    trainer = trainer_with_stubs(verl_config(tmp_path))
    logged = run_steps(trainer, 7, blowup=7)
    # global_step_6 was saved during step 6; step 7's rollout ran on its weights and blew up: 4 is the newest stable
    ckpt = tmp_path / "ckpt" / "global_step_4"
    assert trainer.actor_rollout_wg.loaded == [str(ckpt / "actor")]
    assert trainer.critic_wg.loaded == [str(ckpt / "critic")] if trainer.use_critic else True
    assert trainer.checkpoint_manager.synced == [7]  # the rollout replicas got the restored weights
    assert trainer.kl_ctrl_in_reward.value > 0.05  # the tightening after a rollback, live
    events = [json.loads(x) for x in (tmp_path / "ckpt" / "events.jsonl").read_text().splitlines()]
    assert events[0]["kind"] == "rollback" and events[0]["step"] == 7
    assert logged[-1]["guard/rollbacks"] == 1.0 and "guard/kl_coef" in logged[-1]
    assert trainer.klguard.session.stable == [2, 4]


def test_state_beside_verls_checkpoint_resumes_the_guard_and_the_kl_controller(tmp_path):
    first = trainer_with_stubs(verl_config(tmp_path))
    run_steps(first, 8, blowup=7)
    saved = json.loads((tmp_path / "ckpt" / "global_step_8" / STATE_FILE).read_text())
    assert saved["kl_ctrl"]["value"] == first.kl_ctrl_in_reward.value  # verl #2653: verl saves no KL controller
    second = trainer_with_stubs(verl_config(tmp_path))
    second._load_checkpoint()  # verl's: finds global_step_8 (trainer.resume_mode=auto)
    assert second.global_steps == 8
    assert second.kl_ctrl_in_reward.value == first.kl_ctrl_in_reward.value
    assert second.klguard.session.state_dict() == first.klguard.session.state_dict()
    assert second.klguard.session.stable == first.klguard.session.stable


def test_no_stable_checkpoint_or_no_rollbacks_left_pauses_with_a_checkpoint(tmp_path, capsys):
    trainer = trainer_with_stubs(verl_config(tmp_path, "+klguard.guard.max_rollbacks=0"))
    run_steps(trainer, 12, blowup=5)
    assert trainer.total_training_steps == 5 and trainer.global_steps == 5  # fit() ends after this step
    assert (tmp_path / "ckpt" / "global_step_5" / STATE_FILE).is_file()
    assert "paused at step 5" in capsys.readouterr().out


def test_kl_loss_coefficient_and_lr_apply_at_the_relaunch(tmp_path):
    overrides = ("algorithm.use_kl_in_reward=False", "actor_rollout_ref.actor.use_kl_loss=True",
                 "actor_rollout_ref.actor.kl_loss_coef=0.05")
    first = trainer_with_stubs(verl_config(tmp_path, *overrides))
    run_steps(first, 8, blowup=7)
    relaunch = first.klguard.relaunch
    assert relaunch["actor_rollout_ref.actor.kl_loss_coef"] > 0.05
    assert relaunch["actor_rollout_ref.actor.optim.lr"] < 1e-6  # verl's default lr, cut
    config = verl_config(tmp_path, *overrides)
    KLGuardTrainer(config)  # a relaunch: the guard's settings go into the config before verl builds workers
    assert config.actor_rollout_ref.actor.kl_loss_coef == relaunch["actor_rollout_ref.actor.kl_loss_coef"]
    assert config.actor_rollout_ref.actor.optim.lr == relaunch["actor_rollout_ref.actor.optim.lr"]
