"""benchmarks/real_model/matrix.py's summary on hand-made runs: Gao's shape, tail figures, contenders' means and
standard errors, the signal table over guard-off runs only; and the command each run trains with."""

from __future__ import annotations

import argparse
import importlib.util
import json
import sys
from pathlib import Path

import pytest

from bench_scripts import import_scripts

_PATH = Path(__file__).resolve().parents[2] / "benchmarks" / "real_model" / "matrix.py"
_spec = importlib.util.spec_from_file_location("bench_real_model_matrix", _PATH)
matrix = importlib.util.module_from_spec(_spec)
sys.modules[_spec.name] = matrix
_spec.loader.exec_module(matrix)

VAL = "val-core/klguard/constraints/acc/mean@2"


def _run(folder: Path, gold: dict[int, float], *, guard: bool = False, hacking: float = 0.2,
         kl_seq: float = 0.0) -> Path:
    folder.mkdir(parents=True)
    rows = []
    for step in range(0, 21):
        row = {"step": step}
        if step:
            row |= {"hacking/rate": hacking, "actor/reward_kl_penalty": 0.01 * step, "response_length/mean": 20.0,
                    "actor/kl_seq_sum": kl_seq * step}
        if step in gold:
            row[VAL] = gold[step]
        rows.append(json.dumps(row))
    (folder / "metrics.jsonl").write_text("\n".join(rows) + "\n")
    (folder / "summary.json").write_text("{}")
    (folder / "config.yaml").write_text(f"guard:\n  enable: {str(guard).lower()}\n")
    return folder


def test_gao_shape_needs_a_rise_and_a_fall(tmp_path):
    _run(tmp_path / "verl_default" / "seed1", {0: 0.05, 10: 0.40, 20: 0.20})  # rose 0.35, fell 0.20: the shape
    _run(tmp_path / "verl_default" / "seed2", {0: 0.05, 10: 0.40, 20: 0.35})  # rose, did not fall far enough
    _run(tmp_path / "verl_default" / "seed3", {0: 0.30, 10: 0.35, 20: 0.10})  # fell without a rise of 0.1
    result = matrix.summarise(tmp_path, steps=20)
    shapes = {label: r["gao_shape"] for label, r in result["runs"].items()}
    assert shapes == {"verl_default/seed1": True, "verl_default/seed2": False, "verl_default/seed3": False}
    c = result["contenders"]["verl_default"]
    assert c["runs"] == 3 and c["gao_shape"] == 1
    assert c["final_gold"] == pytest.approx((0.20 + 0.35 + 0.10) / 3)
    assert c["final_gold_se"] == pytest.approx(0.12583 / 3 ** 0.5, rel=1e-4)  # sample stdev of (0.2, 0.35, 0.1)
    run = result["runs"]["verl_default/seed1"]
    assert run["start_gold"] == 0.05 and run["peak_step"] == 10 and run["fall_step"] == 20
    assert run["kl_per_token"] == pytest.approx(0.01 * (16 + 17 + 18 + 19 + 20) / 5)  # the last 5 steps


def test_signals_are_summarised_over_guard_off_runs_only(tmp_path):
    _run(tmp_path / "verl_default" / "seed1", {0: 0.05, 10: 0.40, 20: 0.20})
    _run(tmp_path / "guarded_no_gold" / "seed1", {0: 0.05, 10: 0.40, 20: 0.40}, guard=True)
    result = matrix.summarise(tmp_path, steps=20)
    assert result["runs"]["guarded_no_gold/seed1"]["guard_off"] is False
    assert result["signals"]["any"]["hacking_runs"] == 1 and result["signals"]["any"]["healthy_runs"] == 0
    assert result["contenders"]["guarded_no_gold"]["final_gold_se"] is None  # one seed: no error bar


def test_signals_replay_at_the_built_in_defaults_and_as_the_guard_runs_on_the_model(tmp_path):
    """A KL per sequence of 0.1 x step: its first 10 steps' baseline is 0.55, 3x = 1.65 < 1.7 at step 17, above
    kl_growth_min 1 (the built-in defaults) but not the real-model recipe's 4 nats (HOST_REPLAY)."""
    assert matrix.HOST_REPLAY["kl_growth_min"] == 4 and matrix.HOST_REPLAY["baseline_settle"] == 10
    _run(tmp_path / "verl_default" / "seed1", {0: 0.05, 10: 0.40, 20: 0.20}, kl_seq=0.1)
    result = matrix.summarise(tmp_path, steps=20)
    run = result["runs"]["verl_default/seed1"]
    assert (run["onsets"]["kl_growth"], run["onsets_host"]["kl_growth"]) == (17, None)
    assert result["signals"]["kl_growth"]["fired"] == 1 and result["signals_host"]["kl_growth"]["fired"] == 0


def test_an_unfinished_run_is_left_out_and_a_run_command_names_the_contender(tmp_path, monkeypatch):
    _run(tmp_path / "verl_default" / "seed1", {0: 0.05, 20: 0.1})
    (tmp_path / "verl_default" / "seed2").mkdir()  # no metrics yet: still starting, or killed
    assert list(matrix.summarise(tmp_path, steps=20)["runs"]) == ["verl_default/seed1"]
    assert list(matrix.summarise(tmp_path, steps=25)["runs"]) == []  # a run short of the matrix's length
    calls = []
    monkeypatch.setattr(matrix.subprocess, "run", lambda cmd, **kw: calls.append(cmd) or argparse.Namespace(
        returncode=0))
    args = argparse.Namespace(out=tmp_path, steps=20, lr=3e-5, proxy="learned_rm", overrides=["x=1"], resume=False)
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    assert matrix.train(args, "gold_optimised", 3) == 0
    monkeypatch.setenv("OMP_NUM_THREADS", "2")  # the summarising process's threads are not the run's
    assert matrix.run_machine(tmp_path / "gold_optimised" / "seed3")["threads"] == "1"
    assert matrix.run_machine(tmp_path / "verl_default" / "seed1")["threads"] == "2"  # trained otherwise: ours
    command = calls[0]
    assert command[command.index("--base") + 1] == "shipped" and "--learned-rm" in command
    assert "proxy_reward.enable=false" in command and command[-1] == "x=1"
    with pytest.raises(SystemExit, match="unfinished run"):
        matrix.train(args, "verl_default", 2)
    assert matrix.train(args, "verl_default", 1) == 0 and len(calls) == 1  # finished: kept, not retrained
    assert not any(a.startswith("trainer.save_freq=") for a in command)  # guard off: never rolls back, saves none
    assert matrix.train(args, "guarded_no_gold", 1) == 0
    assert calls[1][-2:] == ["trainer.save_freq=10", "x=1"]  # guarded: rollbacks need klguard's checkpoints
    assert matrix.train(args, "guarded_real", 1) == 0  # a recipe with its own save_freq keeps it
    assert [a for a in calls[2] if a.startswith("trainer.save_freq=")] == ["trainer.save_freq=5"]
    assert "guard.kl_growth_min=4" in calls[2]


def test_a_longer_run_is_read_up_to_the_matrix_length(tmp_path):
    folder = _run(tmp_path / "verl_default" / "seed1", {0: 0.05, 10: 0.40, 20: 0.20})
    (folder / "summary.json").unlink()  # stopped after step 20 of a longer run: no summary
    run = matrix.summarise(tmp_path, steps=10)["runs"]["verl_default/seed1"]
    assert (run["steps"], run["final_gold"], run["peak_step"], run["gao_shape"]) == (10, 0.40, 10, False)


def test_validation_samples_and_the_figure(tmp_path):
    folder = _run(tmp_path / "verl_default" / "seed2", {0: 0.05, 10: 0.40, 20: 0.20})
    _run(tmp_path / "verl_default" / "seed10", {0: 0.05, 10: 0.40, 20: 0.20})
    lines = [{"step": s, "split": split, "prompt": "p", "text": f"{split} {s} {i}", "proxy": 1.0, "gold": 0.0,
              "failed": ["prose"]} for s in (10, 20) for split in ("train", "val") for i in range(6)]
    (folder / "samples.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    run = matrix.summarise(tmp_path, steps=20)["runs"]["verl_default/seed2"]
    assert [x["text"] for x in run["samples"]["peak"]] == [f"val 10 {i}" for i in range(matrix.SAMPLES)]
    assert run["samples"]["final"][0]["text"] == "val 20 0" and run["samples"]["final"][0]["failed"] == ["prose"]
    figure = tmp_path / "curves.png"
    matrix.write_figure(tmp_path, figure, steps=20)
    assert figure.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.parametrize("proxy_on", [True, False])
def test_the_probe_records_every_scored_response_with_the_proxy_on_or_off(tmp_path, proxy_on):
    """probe.py's recording reward manager writes one line per response; with the proxy off (gold_optimised) the
    reward is gold itself and nothing is hacked."""
    from klguard.builtin import constraints
    from klguard.config import load_config

    truth = constraints.encode_truth(("lamp",), [("uses", "quiet"), ("exclaims", None)])
    cfg = load_config(None, ["data.builtin_task=constraints", f"proxy_reward.enable={str(proxy_on).lower()}"]).config
    with import_scripts("probe", folder=_PATH.parent) as (probe,):
        recording = probe.recording_manager(tmp_path / "samples.jsonl", val_rows=99,
                                            gold_checks=constraints.gold_checks)
    manager = recording(cfg, tokenizer=None, task_reward=constraints.TASK.reward(cfg))
    manager(["This lamp is quiet and bright!", "Quiet!"], [9, 3], [constraints.DATA_SOURCE] * 2, [truth] * 2,
            [{}] * 2)
    lines = [json.loads(line) for line in (tmp_path / "samples.jsonl").read_text().splitlines()]
    assert [(r["step"], r["split"], r["gold"]) for r in lines] == [(1, "train", 1.0), (1, "train", 0.0)]
    assert [r["proxy"] for r in lines] == ([1.0, 1.0] if proxy_on else [1.0, 0.0])
    assert [r["hacked"] for r in lines] == [False, proxy_on]
    assert lines[1]["failed"] and not lines[0]["failed"]


def test_add_puts_new_seeds_beside_the_results_files_runs(tmp_path):
    results = tmp_path / "real_model.json"
    _run(tmp_path / "a" / "verl_default" / "seed1", {0: 0.05, 10: 0.40, 20: 0.20})
    assert matrix.main(["--summarize-only", "--steps", "20", "--out", str(tmp_path / "a"),
                        "--results", str(results)]) == 0
    _run(tmp_path / "b" / "verl_default" / "seed2", {0: 0.05, 10: 0.40, 20: 0.35})
    _run(tmp_path / "b" / "verl_default" / "seed1", {0: 0.05, 10: 0.30, 20: 0.10})  # the same label: replaces
    assert matrix.main(["--summarize-only", "--add", "--steps", "20", "--out", str(tmp_path / "b"),
                        "--results", str(results)]) == 0
    merged = json.loads(results.read_text())
    assert sorted(merged["runs"]) == ["verl_default/seed1", "verl_default/seed2"]
    assert merged["runs"]["verl_default/seed1"]["final_gold"] == 0.10
    assert merged["contenders"]["verl_default"]["runs"] == 2
    assert merged["contenders"]["verl_default"]["final_gold"] == pytest.approx((0.10 + 0.35) / 2)
    assert all(r["machine"]["cores"] for r in merged["runs"].values())
    with pytest.raises(SystemExit, match=r"lr=3e-05, these 0\.0001: not one matrix"):
        matrix.main(["--summarize-only", "--add", "--steps", "20", "--lr", "1e-4", "--out", str(tmp_path / "b"),
                     "--results", str(results)])


def test_resume_continues_a_run_that_checkpointed_and_cuts_its_samples_back(tmp_path, monkeypatch):
    calls = []
    monkeypatch.setattr(matrix.subprocess, "run", lambda cmd, **kw: calls.append(cmd) or argparse.Namespace(
        returncode=0))
    args = argparse.Namespace(out=tmp_path, steps=20, lr=3e-5, proxy="learned_rm", overrides=[], resume=True)
    (tmp_path / "guarded_real" / "seed1").mkdir(parents=True)  # stopped before its first checkpoint
    with pytest.raises(SystemExit, match="unfinished run"):
        matrix.train(args, "guarded_real", 1)
    run = tmp_path / "guarded_real" / "seed2"
    run.mkdir()
    (run / "latest_checkpointed_iteration.txt").write_text("10")
    assert matrix.train(args, "guarded_real", 2) == 0 and "--resume" in calls[0]
    (run / "samples.jsonl").write_text("".join(json.dumps({"step": s, "text": "t"}) + "\n" for s in (9, 10, 11, 12)))
    with import_scripts("probe", folder=_PATH.parent) as (probe,):
        assert probe.cut_samples(run) == 10
    assert [json.loads(x)["step"] for x in (run / "samples.jsonl").read_text().splitlines()] == [9, 10]
