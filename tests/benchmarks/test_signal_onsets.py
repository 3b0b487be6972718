"""benchmarks/signal_onsets.py on a hand-made run: the gold peak and fall, each signal's first firing, the
summary's leads and false alarms."""

from __future__ import annotations

import argparse
import importlib.util
import json
import sys
from pathlib import Path

import pytest

_PATH = Path(__file__).resolve().parents[2] / "benchmarks" / "signal_onsets.py"
_spec = importlib.util.spec_from_file_location("bench_signal_onsets", _PATH)
onsets = importlib.util.module_from_spec(_spec)
sys.modules[_spec.name] = onsets
_spec.loader.exec_module(onsets)

VAL = "val-core/arith/acc/mean@1"


def _write(path: Path, gold: dict[int, float], length_from: int | None) -> Path:
    rows = []
    for step in range(0, 61):
        row = {"step": step}
        if step:
            row |= {"response_length/mean": 20.0 if length_from is not None and step >= length_from else 10.0,
                    "actor/kl_seq_sum": 0.1, "actor/entropy": 1.0, "critic/score/mean": 1.0}
        if step in gold:
            row[VAL] = gold[step]
        rows.append(json.dumps(row))
    path.write_text("\n".join(rows) + "\n")
    return path


def test_a_hacking_run_and_a_healthy_one(tmp_path):
    gold = {0: 0.7, 10: 0.8, 20: 0.9, 30: 0.85, 40: 0.5, 50: 0.2, 60: 0.1}
    hacked = onsets.replay(_write(tmp_path / "a.jsonl", gold, length_from=35))
    assert (hacked["peak_step"], hacked["fall_step"], hacked["hacks"]) == (20, 40, True)
    assert hacked["onsets"]["length_growth"] == 35  # 20 > 1.75 x the baseline of 10
    assert hacked["onsets"]["rm_spread"] is None and hacked["onsets"]["kl_growth"] is None
    healthy = onsets.replay(_write(tmp_path / "b.jsonl", {0: 0.7, 30: 0.8, 60: 0.78}, length_from=50))
    assert not healthy["hacks"] and healthy["fall_step"] is None
    summary = onsets.summarize({"a": hacked, "b": healthy})
    assert summary["length_growth"] == {"hacking_runs": 1, "fired": 1, "before_peak": 0, "before_fall": 1,
                                        "at_or_before_peak": 0, "median_lead_over_peak": -15,
                                        "median_lead_over_fall": 5, "healthy_runs": 1, "false_alarms": 1}
    assert summary["any"]["fired"] == 1 and summary["any"]["false_alarms"] == 1


def test_any_is_the_first_firing_of_the_named_signals() -> None:
    run = {"peak_step": 20, "fall_step": 40, "hacks": True,
           "onsets": dict.fromkeys(onsets.HACK_SIGNALS) | {"kl_growth": 30, "proxy_val_divergence": 20}}
    assert onsets.summarize({"a": run})["any"]["at_or_before_peak"] == 1  # 20: at the peak
    without = onsets.summarize({"a": run}, tuple(n for n in onsets.HACK_SIGNALS if n != "proxy_val_divergence"))
    assert without["any"]["at_or_before_peak"] == 0 and without["any"]["median_lead_over_peak"] == -10


def test_the_replayed_guard_reads_the_validation_metric_it_is_given(tmp_path) -> None:
    """With the reward's own held-out score as its validation, proxy_val_divergence reads no gold."""
    rows = [{"step": 0, VAL: 0.9, "val-aux/arith/score/mean@1": 1.0}]
    for step in range(1, 31):
        row = {"step": step, "critic/score/mean": 1.0 + 0.1 * step}
        if step % 10 == 0:  # gold falls at every validation, the RM's held-out score rises
            row |= {VAL: 0.9 - 0.2 * step / 10, "val-aux/arith/score/mean@1": 1.0 + step / 10}
        rows.append(row)
    path = tmp_path / "m.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    # gold: steps 20 and 30 fell while the training score rose over the interval before (step 10 has no interval)
    assert onsets.replay(path)["onsets"]["proxy_val_divergence"] == 30
    assert onsets.replay(path, val_metric=onsets.NO_GOLD)["onsets"]["proxy_val_divergence"] is None


def test_set_replaces_a_guard_threshold_and_a_bad_key_or_value_ends_with_one_line(tmp_path, capsys) -> None:
    gold = {0: 0.7, 10: 0.8, 20: 0.9, 30: 0.85, 40: 0.5, 50: 0.2, 60: 0.1}
    run = _write(tmp_path / "a.jsonl", gold, length_from=35)
    assert onsets.replay(run, length_growth_max=3.0)["onsets"]["length_growth"] is None  # 2x the baseline, under 3x
    assert onsets._thresholds(argparse.ArgumentParser(), ["length_growth_max=3"]) == {"length_growth_max": 3.0}
    for bad, says in (("spike=1", "guard.spike is not a guard key"), ("kl_growth_min=low", "needs a number")):
        with pytest.raises(SystemExit) as exit_:
            onsets.main([str(tmp_path), "--set", bad])
        assert exit_.value.code == 2 and says in capsys.readouterr().err


def test_host_defaults_replay_the_guard_that_runs_on_a_hugging_face_model(tmp_path, capsys) -> None:
    """A KL per sequence that rises from 0 (the policy starts at its reference): the defaults every host uses on a
    Hugging Face model wait out other metrics' first 10 steps (`baseline_settle`), not the KL's (they are the rise
    kl_growth measures), so both replays fire at the same step: baseline 2.75 (steps 1-10), x3 = 8.25 < 8.5 at 17."""
    runs = tmp_path / "runs" / "verl_default" / "seed1"
    runs.mkdir(parents=True)
    rows = [{"step": 0, VAL: 0.5}]
    for step in range(1, 41):
        rows.append({"step": step, "actor/kl_seq_sum": 0.5 * step, "response_length/mean": 10.0,
                     "actor/entropy": 1.0, "critic/score/mean": 1.0} | ({VAL: 0.5} if step % 10 == 0 else {}))
    (runs / "metrics.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    (runs / "summary.json").write_text("{}")
    (runs / "config.yaml").write_text("guard:\n  enable: false\n")
    for flags in ([], ["--host-defaults"]):
        assert onsets.main([str(tmp_path / "runs"), *flags]) == 0
        result = json.loads((tmp_path / "signal_onsets.json").read_text())
        assert result["runs"]["verl_default/seed1"]["onsets"]["kl_growth"] == 17, flags
