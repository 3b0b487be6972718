"""`klguard demo` and `klguard calibrate` end to end: child training runs, tables, JSON and report."""

from __future__ import annotations

import html
import json

from klguard.commands.cli import main


def test_demo_trains_both_settings_and_writes_one_comparison(fast_overrides, tmp_path, capsys):
    out = tmp_path / "demo"
    code = main(["demo", "--out", str(out), *fast_overrides, "trainer.total_training_steps=3", "trainer.test_freq=3",
                 "trainer.save_freq=-1"])
    assert code == 0
    captured = capsys.readouterr()
    printed = captured.out
    assert "klguard default" in printed and "verl default KL" in printed and "report:" in printed
    assert "elapsed: " in printed and " wall" in printed
    assert "\r" not in captured.err  # not a terminal: plain progress lines, no bar redraws
    assert "klguard demo: 6/6 steps (100%)" in captured.err
    for folder, beta in (("klguard_default", None), ("verl_default", 0.001)):
        rows = [json.loads(line) for line in (out / folder / "metrics.jsonl").read_text().splitlines()]
        assert [r["step"] for r in rows] == [0, 1, 2, 3]
        if beta is not None:
            assert rows[-1]["actor/reward_kl_penalty_coeff"] == beta
    report = (out / "report.html").read_text()
    assert len(report) > 10_000
    # the samples panel: each run's validation responses (dumped to its validation_generations folder)
    assert "<h2>Sampled responses</h2>" in report and report.count("<h3>") == 2
    first = json.loads((out / "verl_default" / "validation_generations" / "0.jsonl").read_text().splitlines()[0])
    assert html.escape(first["output"]) in report


def test_calibrate_sweeps_the_grid_and_recommends_a_target(fast_overrides, tmp_path, capsys):
    out = tmp_path / "cal"
    code = main(["calibrate", *fast_overrides, "calibrate.grid=[0.01,0.05]", f"calibrate.output_dir={out}",
                 "trainer.total_training_steps=4", "trainer.test_freq=1", "trainer.save_freq=-1",
                 "calibrate.max_hacking_rate=1.0", "calibrate.extend_grid=false"])
    assert code == 0
    result = json.loads((out / "calibration.json").read_text())
    assert [p["target_kl"] for p in result["points"]] == [0.01, 0.05]
    assert all(p["steps"] == 4 for p in result["points"])
    assert result["recommendation"]["target_kl"] in (0.01, 0.05)
    assert f"algorithm.kl_ctrl.target_kl={result['recommendation']['target_kl']}" in result["command"]
    assert "calibrate." not in result["command"] and "data.builtin_train_size=64" in result["command"]
    config = (out / "target_kl_0.05" / "config.yaml").read_text()
    assert "target_kl: 0.05" in config and "type: adaptive" in config
    printed = capsys.readouterr().out
    assert "recommended target_kl" in printed and "train with:" in printed
    assert (out / "report.html").is_file()


def test_calibrate_needs_kl_in_the_reward(fast_overrides, capsys):
    code = main(["calibrate", *fast_overrides, "algorithm.use_kl_in_reward=false"])
    assert code == 2
    assert "set algorithm.use_kl_in_reward=true" in capsys.readouterr().err
