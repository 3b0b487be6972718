"""`klguard calibrate` stops a hacking run at its rung, keeps finished runs on a rerun and resumes a killed one."""

from __future__ import annotations

import json
import shutil

from klguard.commands.cli import main


def _calibrate(out, *overrides):
    return main(["calibrate", f"calibrate.output_dir={out}", "calibrate.grid=[0.01,0.05]", "trainer.save_freq=2",
                 "trainer.logger=[jsonl]", "trainer.report=false", *overrides])


def test_a_hacking_run_stops_at_its_rung_and_a_rerun_keeps_it(tmp_path, capsys):
    # the shipped policy hacks on about 5% of its samples from the start: with a limit of 0 both runs hack at once
    out = tmp_path / "cal"
    args = ("trainer.total_training_steps=30", "trainer.test_freq=2", "calibrate.max_hacking_rate=0.0",
            "calibrate.stop_hacking_rate=0.0", "calibrate.stop_hacking_validations=1", "calibrate.extend_grid=false",
            f"trainer.default_local_dir={tmp_path / 'unused'}")
    assert _calibrate(out, *args) == 0
    result = json.loads((out / "calibration.json").read_text())
    for point in result["points"]:
        assert point["stopped"].startswith("hacking rate over 0 at 1 validations in a row"), point
        assert 2 <= point["steps"] < 30  # stopped at a validation, not trained to the end
        assert (out / f"target_kl_{point['target_kl']:g}" / f"global_step_{point['steps']}").is_dir()
    assert result["steps_trained"] == sum(p["steps"] for p in result["points"]) < 60
    assert result["recommendation"]["target_kl"] is None
    captured = capsys.readouterr()
    assert "stopped early: target_kl=0.01: hacking rate over 0" in captured.out
    before = {p: p.stat().st_mtime_ns for p in out.glob("target_kl_*/metrics.jsonl")}

    assert _calibrate(out, *args) == 0
    assert "kept 2 finished run(s)" in capsys.readouterr().err
    assert {p: p.stat().st_mtime_ns for p in out.glob("target_kl_*/metrics.jsonl")} == before
    assert json.loads((out / "calibration.json").read_text())["points"] == result["points"]

    # early stopping turned off: the stopped runs resume from their checkpoints and train to the end
    assert _calibrate(out, *args, "calibrate.early_stop=false") == 0
    points = json.loads((out / "calibration.json").read_text())["points"]
    assert [(p["steps"], p["stopped"]) for p in points] == [(30, None), (30, None)]
    assert all("klguard: resumed from" in log.read_text() for log in out.glob("target_kl_*.log"))


def test_a_killed_run_resumes_from_its_checkpoint_and_ends_as_if_never_killed(fast_overrides, tmp_path, capsys):
    out = tmp_path / "cal"
    args = (*fast_overrides, "trainer.total_training_steps=4", "trainer.test_freq=2", "calibrate.early_stop=false",
            "calibrate.extend_grid=false", "calibrate.max_hacking_rate=1.0")
    assert _calibrate(out, *args) == 0
    run = out / "target_kl_0.05"
    finished = (run / "metrics.jsonl").read_text().splitlines()
    # what a kill after step 3 leaves: the status says running, the newest checkpoint is step 2's
    status = json.loads((run / "calibrate_status.json").read_text())
    (run / "calibrate_status.json").write_text(json.dumps(status | {"state": "running"}))
    shutil.rmtree(run / "global_step_4")
    (run / "metrics.jsonl").write_text("\n".join(finished[:4]) + "\n")
    capsys.readouterr()

    assert _calibrate(out, *args) == 0
    assert "kept 1 finished run(s)" in capsys.readouterr().err  # target 0.01 was not touched
    assert "klguard: resumed from" in (out / "target_kl_0.05.log").read_text()  # not retrained from step 0
    resumed = (run / "metrics.jsonl").read_text().splitlines()
    strip = ("timing_s/", "perf/")

    def values(lines):
        return [{k: v for k, v in json.loads(line).items() if not k.startswith(strip)} for line in lines]
    assert values(resumed) == values(finished)
    assert json.loads((run / "calibrate_status.json").read_text())["state"] == "finished"


def test_changed_arguments_start_the_runs_afresh_and_a_longer_grid_trains_only_the_new_target(
        fast_overrides, tmp_path, capsys):
    out = tmp_path / "cal"
    base = (*fast_overrides, "trainer.test_freq=2", "calibrate.early_stop=false", "calibrate.extend_grid=false",
            "calibrate.max_hacking_rate=1.0")
    assert _calibrate(out, *base, "trainer.total_training_steps=2") == 0
    assert _calibrate(out, *base, "trainer.total_training_steps=4") == 0
    assert "kept" not in capsys.readouterr().err
    points = json.loads((out / "calibration.json").read_text())["points"]
    assert [p["steps"] for p in points] == [4, 4]

    assert _calibrate(out, *base, "trainer.total_training_steps=4", "calibrate.grid=[0.01,0.05,0.1]") == 0
    assert "kept 2 finished run(s)" in capsys.readouterr().err
    points = json.loads((out / "calibration.json").read_text())["points"]
    assert [(p["target_kl"], p["steps"]) for p in points] == [(0.01, 4), (0.05, 4), (0.1, 4)]
