"""A forced blow-up: the guard rolls back to the last stable checkpoint, bit for bit, and training goes on."""

from __future__ import annotations

import json

import torch
from safetensors.torch import load_file

from klguard.builtin.task import TASK
from klguard.config import load_config
from klguard.ppo.trainer import PPOTrainer


class _NullTracker:
    def log(self, metrics, step):
        pass


def test_guard_rolls_back_a_blow_up_to_the_stable_checkpoint(fast_overrides, tmp_path):
    # only the KL rules speak here: the tiny test policy's weak score would trip the penalty-share rule
    quiet = ["guard.penalty_share_max=1000", "guard.hacking_action=none", "guard.length_growth_max=100",
             "guard.length_corr_max=1.0", "guard.ppo_kl_max=1000", "guard.reanchor_rules=[kl_hard]"]
    cfg = load_config(None, [*fast_overrides, *quiet, "guard.enable=true", "trainer.save_freq=1",
                             "trainer.test_freq=-1", "trainer.val_before_train=false",
                             "trainer.total_training_steps=7"]).config
    trainer = PPOTrainer(cfg, task=TASK, log=lambda msg: None)
    normal_lr = cfg.actor_rollout_ref.actor.optim.lr

    def set_lr(lr: float) -> None:
        trainer.state.actor_sched.base_lrs = [lr]
        for group in trainer.state.actor_optim.param_groups:
            group["lr"] = lr

    def sabotage(step: int, metrics: dict) -> None:  # step 3 updates with a huge learning rate, then back
        set_lr(0.05 if step == 2 else normal_lr)

    restored = []
    rollback = trainer.checkpoints.rollback_to

    def spy(step, state) -> int | None:
        restored_step = rollback(step, state)
        restored.append({k: v.clone() for k, v in state.actor.state_dict().items()})
        return restored_step

    trainer.checkpoints.rollback_to = spy
    trainer.fit(_NullTracker(), progress=sabotage)

    events = [json.loads(line) for line in (trainer.run_dir / "events.jsonl").read_text().splitlines()]
    rollbacks = [e for e in events if e["kind"] == "rollback"]
    assert rollbacks and rollbacks[0]["step"] == 4  # the blown-up weights are measured by step 4's rollout
    assert rollbacks[0]["rule"] == "kl_hard"
    assert trainer.state.step == 7  # training went on after the rollback
    assert len(restored) == len(rollbacks)
    stable = trainer.guard.session.stable
    assert stable[:2] == [1, 2] and 3 not in stable  # 3 holds the blow-up, measured by step 4's rollout
    saved = load_file(trainer.checkpoints.manager.path(2) / "actor" / "model.safetensors")
    for name, tensor in saved.items():
        assert torch.equal(restored[0][name], tensor), name
    for step in trainer.checkpoints.manager.steps():
        weights = load_file(trainer.checkpoints.manager.path(step) / "actor" / "model.safetensors")
        assert all(torch.isfinite(t).all() for t in weights.values())
    # the rollback re-anchored the reference to the restored policy, and later checkpoints carry it
    reanchor = [e for e in events if e["kind"] == "reanchor_reference"]
    assert [(e["step"], e["old"], e["new"]) for e in reanchor] == [(4, 0, 2)]
    assert trainer.guard.kl_guard.reference_step == 2
    last = trainer.checkpoints.manager.path(7)
    assert not (trainer.checkpoints.manager.path(2) / "ref").exists()
    ref_saved = load_file(last / "ref" / "model.safetensors")
    for name, tensor in saved.items():
        assert torch.equal(ref_saved[name], tensor), name
    resumed = PPOTrainer(load_config(None, [*fast_overrides, *quiet, "guard.enable=true",
                                            "trainer.total_training_steps=7"]).config, task=TASK,
                         log=lambda msg: None)
    assert resumed.guard.kl_guard.reference_step == 2
    for name, tensor in resumed.state.ref.state_dict().items():
        assert torch.equal(tensor, ref_saved[name]), name


def test_resumed_run_takes_the_same_guard_decisions(fast_overrides, tmp_path):
    from klguard.commands.cli import main

    # the tiny test policy's weak score trips the penalty-share rule: a real, repeated guard decision
    guarded = [*fast_overrides, "guard.enable=true", "guard.cooldown=2", "guard.penalty_share_max=0.01",
               "trainer.save_freq=2", "trainer.test_freq=-1", "trainer.val_before_train=false"]
    assert main(["train", *guarded, "trainer.total_training_steps=6",
                 f"trainer.default_local_dir={tmp_path / 'straight'}"]) == 0
    resumed = [*guarded, f"trainer.default_local_dir={tmp_path / 'resumed'}"]
    assert main(["train", *resumed, "trainer.total_training_steps=3"]) == 0  # ends with a checkpoint at 3
    assert main(["train", *resumed, "trainer.total_training_steps=6"]) == 0

    def events(run):
        return [json.loads(line) for line in (tmp_path / run / "events.jsonl").read_text().splitlines()]

    def coefficients(run):
        lines = (tmp_path / run / "metrics.jsonl").read_text().splitlines()
        return {r["step"]: (r["actor/reward_kl_penalty_coeff"], r["guard/kl_coef"]) for r in map(json.loads, lines)}

    straight = events("straight")
    assert any(e["kind"] == "raise_kl_coef" for e in straight)
    assert events("resumed") == straight
    assert coefficients("resumed") == coefficients("straight")


def test_a_rollback_at_the_last_step_is_validated_again_so_the_final_gold_describes_the_written_weights(
        fast_overrides, tmp_path):
    quiet = ["guard.penalty_share_max=1000", "guard.hacking_action=none", "guard.length_growth_max=100",
             "guard.length_corr_max=1.0", "guard.ppo_kl_max=1000"]
    cfg = load_config(None, [*fast_overrides, *quiet, "guard.enable=true", "trainer.save_freq=1",
                             "trainer.test_freq=-1", "trainer.val_before_train=false",
                             "trainer.total_training_steps=4"]).config
    trainer = PPOTrainer(cfg, task=TASK, log=lambda msg: None)
    normal_lr = cfg.actor_rollout_ref.actor.optim.lr

    def sabotage(step: int, metrics: dict) -> None:  # step 3 blows up; step 4, the last, measures it and rolls back
        lr = 0.05 if step == 2 else normal_lr
        trainer.state.actor_sched.base_lrs = [lr]
        for group in trainer.state.actor_optim.param_groups:
            group["lr"] = lr

    order: list[str] = []
    rollback, validate = trainer.checkpoints.rollback_to, trainer.validate

    def restore_spy(step, state):
        order.append("restore")
        return rollback(step, state)

    def validate_spy():
        order.append("validate")
        return validate() | {"val-core/test/call": float(order.count("validate"))}

    trainer.checkpoints.rollback_to, trainer.validate = restore_spy, validate_spy

    logged: dict[int, dict] = {}

    class Tracker:
        def log(self, metrics, step):
            logged[step] = dict(metrics)

    trainer.fit(Tracker(), progress=sabotage)
    assert trainer.state.step == 4
    assert order == ["validate", "restore", "validate"]  # step 4's validation, the rollback, then the restored one
    assert logged[4]["val-core/test/call"] == 2.0
    saved = load_file(trainer.checkpoints.manager.path(4) / "actor" / "model.safetensors")
    for name, tensor in trainer.state.actor.state_dict().items():  # the weights validated last are the ones written
        assert torch.equal(saved[name], tensor), name
