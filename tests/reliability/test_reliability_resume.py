"""SIGKILL at several points, a damaged newest checkpoint, then resume: metrics equal an uninterrupted run's."""

from __future__ import annotations

import signal

import pytest
from reliability_runs import comparable, records, start_train, wait_until

from klguard.commands.cli import main
from klguard.runtime.checkpoint import KILL_IN_SAVE_ENV, LATEST_FILE, CheckpointManager

STEPS = 6


@pytest.mark.slow
def test_killed_and_resumed_run_equals_an_uninterrupted_one(fast_overrides, tmp_path, capsys):
    base = [*fast_overrides, f"trainer.total_training_steps={STEPS}"]
    straight, run = tmp_path / "straight", tmp_path / "run"
    assert main(["train", *base, f"trainer.default_local_dir={straight}"]) == 0

    # 1. SIGKILL from outside once two steps are logged: anywhere in step 3 or in a checkpoint write
    proc = start_train(base, tmp_path / "err1.txt")
    wait_until(lambda: len(records(run)) >= 2, proc)
    proc.send_signal(signal.SIGKILL)
    assert proc.wait(60) == -signal.SIGKILL

    # 2. resume, and SIGKILL halfway through writing checkpoint 5 (the test hook in klguard.runtime.checkpoint)
    proc = start_train(base, tmp_path / "err2.txt", **{KILL_IN_SAVE_ENV: "5"})
    assert proc.wait(120) == -signal.SIGKILL, (tmp_path / "err2.txt").read_text()
    assert "resumed from" in (tmp_path / "err2.txt").read_text()
    assert (run / ".global_step_5.partial").is_dir() and not (run / "global_step_5").exists()
    assert (run / LATEST_FILE).read_text() == "4"

    # 3. damage the newest checkpoint: resume falls back to the one before, with a warning
    weights = run / "global_step_4" / "actor" / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])
    capsys.readouterr()
    assert main(["train", *base]) == 0
    err = capsys.readouterr().err
    assert f"klguard: warning: checkpoint {run / 'global_step_4'} is damaged (actor/model.safetensors has" in err
    assert f"resumed from {run / 'global_step_3'} at step 3" in err

    # every step logged once, equal to the uninterrupted run bit for bit (timing_s/*, perf/* aside)
    expected, got = records(straight), records(run)
    assert [r["step"] for r in got] == list(range(1, STEPS + 1))
    assert [comparable(r) for r in got] == [comparable(r) for r in expected]
    manager = CheckpointManager(run, warn=lambda msg: (_ for _ in ()).throw(AssertionError(msg)))
    assert manager.latest() == run / f"global_step_{STEPS}"
    assert all(manager.is_valid(step) for step in manager.steps())
    assert not list(run.glob(".global_step_*"))
