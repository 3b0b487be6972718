"""benchmarks/trl_real_model.py: a finished grpo_real_model.py run folder into the results JSON's record."""

from __future__ import annotations

import json

import pytest

from bench_scripts import import_scripts


@pytest.fixture(scope="module")
def collector():
    with import_scripts("trl_real_model") as (module,):
        yield module


def _run_folder(path, events):
    path.mkdir()
    (path / "summary.json").write_text(json.dumps({"seed": 1, "gold": 0.2, "hacking_rate": 0.1, "guarded": True,
                                                   "response_length": 12.0, "final_beta": 0.3,
                                                   "train_runtime_s": 600.0}))
    history = [{"step": 1, "kl": 0.0, "beta": 0.05, "loss": 0.1}, {"train_runtime": 600.0, "step": 1}]
    (path / "trainer_state.json").write_text(json.dumps({"log_history": history}))
    (path / "events.jsonl").write_text("".join(json.dumps(e) + "\n" for e in events))
    return path


def test_the_restored_steps_come_from_the_events_else_from_the_console(collector, tmp_path):
    rollback = {"kind": "rollback", "step": 12, "rule": "kl_hard", "metric": "actor/kl_loss", "value": 0.6}
    newer = collector.collect(_run_folder(tmp_path / "a", [{**rollback, "restored_step": 5},
                                                           {"kind": "raise_kl_coef", "step": 12}]), None)
    assert newer["rollbacks"] == [{"step": 12, "rule": "kl_hard", "metric": "actor/kl_loss", "value": 0.6}]
    assert newer["restored"] == [5]
    assert newer["train_log"] == [{"step": 1, "kl": 0.0, "beta": 0.05}]  # the per-step rows, TRL's keys kept
    console = tmp_path / "b.log"
    console.write_text("klguard: rolled back to /out/guarded/checkpoint-5\nnoise\n"
                       "klguard: rolled back to the reference policy (step 0; no stable checkpoint on disk)\n")
    older = collector.collect(_run_folder(tmp_path / "b", [rollback, {**rollback, "step": 20}]), console)
    assert older["restored"] == [5, 0]


def test_an_unfinished_run_is_one_line(collector, tmp_path):
    (tmp_path / "run").mkdir()
    with pytest.raises(SystemExit, match=r"summary\.json is missing"):
        collector.collect(tmp_path / "run", None)
