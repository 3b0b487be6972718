"""Malformed command lines end in one clear line naming the key, exit code 2, no traceback."""

from __future__ import annotations

import subprocess
import sys

import pytest

from klguard.commands.cli import main

MALFORMED = [
    # (overrides, text the one-line message must contain)
    (["algorithm.kl_ctrl.target_kll=0.1"], "did you mean algorithm.kl_ctrl.target_kl"),
    (["actor_rollout_ref.actor.clip_ratoi=0.2"], "did you mean actor_rollout_ref.actor.clip_ratio"),
    (["trainer.totl_epochs=3"], "did you mean trainer.total_epochs"),
    (["nonsense=1"], "unknown config key nonsense"),
    (["algorithm.kl_ctrl.target_kl=abc"], "algorithm.kl_ctrl.target_kl"),
    (["trainer.total_epochs=1.5"], "trainer.total_epochs"),
    (["data.train_batch_size=[1,2]"], "data.train_batch_size"),
    (["algorithm.use_kl_in_reward=maybe"], "algorithm.use_kl_in_reward"),
    (["algorithm.kl_ctrl.target_kl=0"], "algorithm.kl_ctrl.target_kl=0"),
    (["algorithm.kl_ctrl.target_kl=-0.01"], "algorithm.kl_ctrl.target_kl"),
    (["algorithm.kl_ctrl.horizon=0"], "algorithm.kl_ctrl.horizon"),
    (["actor_rollout_ref.actor.clip_ratio_c=1.0"], "actor_rollout_ref.actor.clip_ratio_c"),
    (["algorithm.kl_penalty=k9"], "algorithm.kl_penalty"),
    (["algorithm.kl_ctrl.type=pidd"], "algorithm.kl_ctrl.type='pidd' is not one of: adaptive, fixed, pid"),
    (["algorithm.kl_ctrl.type=[1]"], "algorithm.kl_ctrl.type=[1] is not one of"),
    (["algorithm.kl_penalty=full"], "algorithm.kl_penalty='full' is refused: klguard does not implement the full"),
    (["actor_rollout_ref.actor.kl_loss_type=full"], "actor_rollout_ref.actor.kl_loss_type='full' is refused"),
    (["guard.hacking_action=explode"], "guard.hacking_action='explode' is not one of: none, raise_kl_coef, rollback"),
    (["guard.spike_min_history=21"], "guard.spike_min_history=21 must be <= spike_window (20)"),
    (["actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=64"], "larger than the mini-batch"),
    (["actor_rollout_ref.actor.ppo_mini_batch_size=48"], "must divide data.train_batch_size=64"),
    (["critic.ppo_micro_batch_size_per_gpu=5"], "must divide the mini-batch"),
    (["algorithm.adv_estimator=gdpo"], "algorithm.gdpo_reward_keys"),
    (["actor_rollout_ref.actor.loss_agg_mode=seq-sum"], "actor_rollout_ref.actor.loss_agg_mode"),
    (["trainer.logger=[console,slack]"], "trainer.logger"),
    (["data.truncation=center"], "data.truncation"),
    (["actor_rollout_ref.rollout.top_p=0"], "actor_rollout_ref.rollout.top_p"),
    (["actor_rollout_ref.actor.optim.lr=-1e-4"], "actor_rollout_ref.actor.optim.lr"),
    (["data.train_files=/tmp/x.parquet"], "data.val_files"),
    (["noequals"], "not of the form key.path=value"),
    (["global_profiler.tool=mstx"], "global_profiler.tool='mstx' is not supported"),
    (["global_profiler.tool=torch"], "global_profiler.steps=None must list the steps"),
    (["global_profiler.tool=torch", "global_profiler.steps=[0,2]"], "global_profiler.steps=[0, 2]"),
    (["global_profiler.tool=torch", "global_profiler.steps=[1]",
      "actor_rollout_ref.actor.profiler.tool_config.torch.contents=[cpu,gpu]"], "contents='gpu' is not one of"),
    (["actor_rollout_ref.actor.profiler.ranks=[-1]"], "actor_rollout_ref.actor.profiler.ranks=[-1]"),
]


@pytest.mark.parametrize(("overrides", "expected"), MALFORMED, ids=[" ".join(o) for o, _ in MALFORMED])
def test_malformed_command_line_gives_one_line_and_exit_2(overrides, expected, capsys):
    code = main(["train", "--print-config", *overrides])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2
    assert len(err) == 1, err
    assert err[0].startswith("klguard: error: ")
    assert expected in err[0]


def test_bad_yaml_file_names_the_file(tmp_path, capsys):
    bad = tmp_path / "bad.yaml"
    bad.write_text("algorithm:\n  kl_ctrl: [unclosed\n")
    assert main(["train", "--config", str(bad), "--print-config"]) == 2
    err = capsys.readouterr().err
    assert str(bad) in err and "not valid YAML" in err


def test_unknown_key_in_yaml_file_is_an_error(tmp_path, capsys):
    cfg = tmp_path / "c.yaml"
    cfg.write_text("algorithm:\n  kl_ctrl:\n    horizn: 10\n")
    assert main(["train", "--config", str(cfg), "--print-config"]) == 2
    assert "did you mean algorithm.kl_ctrl.horizon" in capsys.readouterr().err


def test_real_process_exit_code_and_no_traceback():
    proc = subprocess.run(
        [sys.executable, "-m", "klguard", "train", "algorithm.kl_ctrl.target_kll=0.1"],
        capture_output=True, text=True, timeout=120,
    )
    assert proc.returncode == 2
    assert "Traceback" not in proc.stderr
    assert proc.stderr.strip().splitlines() == [
        "klguard: error: unknown config key algorithm.kl_ctrl.target_kll; did you mean algorithm.kl_ctrl.target_kl?"
    ]
