"""SIGTERM/SIGINT: finish the step, write a checkpoint, exit 0; a second signal exits at once, corrupting nothing."""

from __future__ import annotations

import signal

from reliability_runs import records, start_train, stop_started, wait_until

from klguard.runtime.checkpoint import LATEST_FILE, CheckpointManager


def _strict_manager(run) -> CheckpointManager:
    def fail(message: str) -> None:
        raise AssertionError(message)

    return CheckpointManager(run, warn=fail)


def test_sigterm_finishes_the_step_writes_a_checkpoint_and_exits_0(fast_overrides, tmp_path):
    run = tmp_path / "run"
    proc = start_train([*fast_overrides, "trainer.total_training_steps=500", "trainer.save_freq=100"],
                       tmp_path / "err.txt")
    wait_until(lambda: len(records(run)) >= 1, proc)
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(60) == 0
    err = (tmp_path / "err.txt").read_text()
    last = records(run)[-1]["step"]
    assert 1 <= last < 500
    assert f"klguard: stopped by SIGTERM after step {last}; latest checkpoint: {run / f'global_step_{last}'}" in err
    assert "Traceback" not in err
    assert (run / LATEST_FILE).read_text() == str(last)
    assert _strict_manager(run).latest() == run / f"global_step_{last}"


def test_a_second_sigint_exits_at_once_without_damage(fast_overrides, tmp_path):
    run, err = tmp_path / "run", tmp_path / "err.txt"
    slow = ["data.train_batch_size=64", "data.builtin_train_size=128", "data.max_response_length=32"]
    proc = start_train([*fast_overrides, *slow, "trainer.total_training_steps=500"], err)
    wait_until(lambda: len(records(run)) >= 2, proc)
    proc.send_signal(signal.SIGINT)
    wait_until(lambda: "SIGINT received" in err.read_text(), proc)
    proc.send_signal(signal.SIGINT)
    assert proc.wait(60) == 128 + signal.SIGINT
    text = err.read_text()
    assert "klguard: second SIGINT: exiting now" in text and "Traceback" not in text
    manager = _strict_manager(run)
    assert manager.latest() is not None  # resumable, every published checkpoint whole
    assert all(manager.is_valid(step) for step in manager.steps())


def test_a_run_a_failed_test_left_running_is_killed(fast_overrides, tmp_path):
    proc = start_train([*fast_overrides, "trainer.total_training_steps=500"], tmp_path / "err.txt")
    assert stop_started() == [proc.pid]  # what the autouse fixture does after a test that did not wait
    assert proc.poll() is not None and stop_started() == []
