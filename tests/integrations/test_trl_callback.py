"""KLGuardCallback in a real TRL GRPOTrainer on CPU: settings, the KL controller, and every action."""

from __future__ import annotations

import json
import shutil

import pytest
import torch
from safetensors.torch import load_file
from trl_runs import grpo_trainer, guarded, inject, snapshot_after_guard, train_logs

from klguard.config import ConfigError
from klguard.integrations.trl import KLGuardCallback

pytestmark = [pytest.mark.scenario, pytest.mark.realmodel]


@pytest.mark.parametrize(("config", "overrides", "message"), [
    ({"beta": 0.0}, (), "GRPOConfig beta is 0"),
    ({"logging_steps": 2}, (), "logging_steps is 2"),
    ({}, ("data.train_batch_size=8",), "data.train_batch_size is not a key of the TRL callback"),
    ({}, ("guard.kl_hard_limit=-1",), "guard.kl_hard_limit=-1.0 must be > 0"),
    ({}, ("guard.kl_hard_lmit=1",), "unknown config key guard.kl_hard_lmit"),
    ({}, ("algorithm.kl_ctrl.kl_coef=0.1",), "set beta there"),
    ({}, ("trl.gold_reward=judge",), "trl.gold_reward='judge' is not a reward function of this trainer (they are: "
                                      "proxy, gold, hacking)"),
])
def test_bad_settings_are_one_line_errors(tmp_path, config, overrides, message):
    trainer = grpo_trainer(tmp_path, steps=1, **config)
    with pytest.raises(ConfigError) as err:
        KLGuardCallback(trainer, overrides)
    assert message in str(err.value)
    assert "\n" not in str(err.value)


def test_controller_sets_beta_for_the_next_step(tmp_path):
    """An adaptive controller moves beta after every step from TRL's `kl`; the loss of the next step uses it."""
    horizon, target = 16, 0.01
    trainer = grpo_trainer(tmp_path, steps=5)
    guarded(trainer, ["guard.enable=false", "algorithm.kl_ctrl.type=adaptive", f"algorithm.kl_ctrl.horizon={horizon}",
                      f"algorithm.kl_ctrl.target_kl={target}"])
    used: list[float] = []
    compute_loss = trainer.compute_loss
    trainer.compute_loss = lambda *a, **k: used.append(trainer.beta) or compute_loss(*a, **k)
    trainer.train()
    logs = train_logs(trainer)
    rows = 8  # completions per optimizer step: the controller's n_steps
    assert used == [logs[s]["beta"] for s in range(1, 6)]  # one loss per step, with the beta logged for it
    for step in range(1, 5):
        error = max(-0.2, min(0.2, logs[step]["kl"] / target - 1))
        expected = logs[step]["beta"] * (1 + error * rows / horizon)
        assert logs[step + 1]["beta"] == pytest.approx(expected, rel=1e-9)
    assert logs[5]["beta"] != logs[1]["beta"]


def test_rollback_restores_checkpoint_bit_for_bit_and_the_lr_cut_survives_the_scheduler(tmp_path, monkeypatch):
    """Steps 1-3 calm (checkpoints 1 and 2 confirmed stable), a forced KL blow-up at step 4: the guard rolls back to
    checkpoint-2 (weights, Adam moments), re-anchors the reference there and halves the lr, which the linear
    schedule keeps from step 5 on."""
    steps, lr = 8, 1e-4
    monkeypatch.setenv("TENSORBOARD_LOGGING_DIR", str(tmp_path / "tb"))
    trainer = grpo_trainer(tmp_path, steps=steps, save_steps=1, learning_rate=lr, lr_scheduler_type="linear",
                           report_to=["tensorboard"])
    callback = guarded(trainer, ["guard.kl_hard_limit=1.0", "guard.kl_hard_patience=1",
                                 "guard.reanchor_rules=[kl_hard]"])
    inject(callback, {4: {"kl": 5.0}})
    seen = snapshot_after_guard(callback, 4)
    trainer.train()
    events = [json.loads(x) for x in (tmp_path / "events.jsonl").read_text().splitlines()]
    kinds = [(e["step"], e["kind"]) for e in events if e["kind"] != "warn"]  # advice (zero_std: 4 alike) aside
    assert kinds[0] == (4, "rollback") and (4, "reanchor_reference") in kinds and (4, "cut_lr") in kinds
    assert callback.session.stable[:2] == [1, 2]

    saved = load_file(tmp_path / "checkpoint-2" / "model.safetensors")
    for name, tensor in saved.items():
        assert torch.equal(seen["model"][name], tensor), name
        assert torch.equal(seen["ref"][name], tensor), name
    saved_optim = torch.load(tmp_path / "checkpoint-2" / "optimizer.pt", weights_only=True)["state"]
    assert saved_optim.keys() == seen["optim"].keys()
    for index, moments in saved_optim.items():
        for key, tensor in moments.items():
            assert torch.equal(seen["optim"][index][key], tensor), (index, key)
    assert seen["buffer"] is None  # rollouts of the abandoned policy are not trained on

    logs = train_logs(trainer)
    used = {s: lr * (steps - s + 1) / steps for s in range(1, steps + 1)}  # the lr step s used: linear, no warm-up
    assert seen["lr"] == [pytest.approx(used[5] * 0.5, rel=1e-6)] * 2  # set for step 5 (two groups: decay or not)
    for step in range(1, 5):
        assert logs[step]["learning_rate"] == pytest.approx(used[step], rel=1e-6)
    for step in range(5, steps + 1):
        assert logs[step]["learning_rate"] == pytest.approx(used[step] * 0.5, rel=1e-6)
        assert logs[step]["guard/lr_scale"] == 0.5
    assert logs[5]["beta"] == pytest.approx(0.001 * 6)  # rollback_kl_coef_factor

    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    tags = set()
    for folder in (tmp_path / "tb").rglob("events.out.tfevents.*"):
        accumulator = EventAccumulator(str(folder))
        accumulator.Reload()
        tags |= set(accumulator.Tags()["scalars"])
    assert {"train/guard/rollbacks", "train/guard/kl_coef", "train/beta"} <= tags


def test_pause_saves_a_checkpoint_and_stops(tmp_path):
    trainer = grpo_trainer(tmp_path, steps=10)
    callback = guarded(trainer, ["guard.kl_hard_limit=1.0", "guard.kl_hard_patience=1", "guard.max_rollbacks=0"])
    inject(callback, {3: {"kl": 5.0}})
    trainer.train()
    assert trainer.state.global_step == 3
    assert (tmp_path / "checkpoint-3" / "model.safetensors").is_file()
    assert "all 0 rollbacks are used" in callback.pause_reason


def test_rollback_without_checkpoint_restores_the_reference(tmp_path):
    """No checkpoint on disk yet: the rollback restores the initial policy (the untouched reference) and a fresh
    optimizer."""
    trainer = grpo_trainer(tmp_path, steps=3)
    initial = {k: v.clone() for k, v in trainer.model.state_dict().items()}
    callback = guarded(trainer, ["guard.kl_hard_limit=1.0", "guard.kl_hard_patience=1"])
    inject(callback, {2: {"kl": 5.0}})
    seen = snapshot_after_guard(callback, 2)
    trainer.train()
    assert all(torch.equal(seen["model"][k], v) for k, v in initial.items())
    assert seen["optim"] == {}


def test_resume_from_a_trl_checkpoint_repeats_the_uninterrupted_decisions(tmp_path):
    """Guard, KL controller and stable checkpoints travel in trainer_state.json: a run resumed from checkpoint-4
    takes the same decisions at steps 5-8 (a controller update every step, a forced rollback at step 6) as the
    run that went on."""
    overrides = ["guard.kl_hard_limit=1.0", "guard.kl_hard_patience=1", "algorithm.kl_ctrl.type=adaptive",
                 "algorithm.kl_ctrl.horizon=16",
                 "algorithm.kl_ctrl.target_kl=0.01"]
    whole = grpo_trainer(tmp_path / "whole", steps=8, save_steps=4)
    inject(guarded(whole, overrides), {6: {"kl": 5.0}})
    whole.train()

    resumed_dir = tmp_path / "resumed"
    shutil.copytree(tmp_path / "whole" / "checkpoint-4", resumed_dir / "checkpoint-4")
    resumed = grpo_trainer(resumed_dir, steps=8, save_steps=4)
    callback = guarded(resumed, overrides)
    inject(callback, {6: {"kl": 5.0}})
    resumed.train(resume_from_checkpoint=str(resumed_dir / "checkpoint-4"))

    def events(folder):
        return [json.loads(x) for x in (folder / "events.jsonl").read_text().splitlines()]

    after = [e for e in events(tmp_path / "whole") if e["step"] > 4]
    assert after and next(e for e in after if e["kind"] != "warn")["kind"] == "rollback"
    assert events(resumed_dir) == after
    a, b = train_logs(whole), train_logs(resumed)
    for step in range(5, 9):
        for key in ("beta", "kl", "learning_rate", "guard/kl_coef", "guard/rollbacks", "guard/target_kl"):
            assert b[step][key] == a[step][key], (step, key)
    assert callback.session.stable[:1] == [4]  # the pending checkpoint-4, confirmed by the resumed step 5


def test_report_reads_a_trl_output_folder(tmp_path):
    """`klguard report DIR` on a TRL output folder: TRL's log history under klguard's names, the guard's events."""
    from klguard.commands.cli import main
    from klguard.commands.report import load_run

    trainer = grpo_trainer(tmp_path, steps=4, save_steps=2)
    inject(guarded(trainer, ["guard.kl_hard_limit=1.0", "guard.kl_hard_patience=1", "trl.gold_reward=gold",
                             "trl.gold_window=2"]),
           {4: {"kl": 5.0}})
    trainer.train()  # no save_state: the newest checkpoint's trainer_state.json is read
    run = load_run(tmp_path)
    assert [r["step"] for r in run.rows] == [1, 2, 3, 4]
    logs = train_logs(trainer)
    assert run.series("actor/kl_loss")[1] == [logs[s]["kl"] for s in (1, 2, 3, 4)]
    assert run.series("response_length/mean")[1] == [logs[s]["completions/mean_length"] for s in (1, 2, 3, 4)]
    assert run.series("actor/kl_coef")[1] == [logs[s]["beta"] for s in (1, 2, 3, 4)]
    assert run.series("guard/gold_validation")[0] == [2, 4]
    assert [e["kind"] for e in run.events if e["kind"] != "warn"][:1] == ["rollback"]
    assert main(["report", str(tmp_path)]) == 0
    assert "rollback" in (tmp_path / "report.html").read_text()
