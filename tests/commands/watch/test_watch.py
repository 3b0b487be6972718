"""`klguard watch`: the guard in advisory mode over logs written by the trainers' own writers."""

from __future__ import annotations

import json
import math
import os
import threading
import time

import pytest

from klguard.commands.cli import main

BLOWUP = 8  # the first step whose KL (0.8) is above the external hosts' kl_hard_limit (0.5)
STOP = BLOWUP + 2  # the third such step in a row (kl_hard_patience 3): the rollback


def verl_step(step: int, kl: float | None = None) -> dict[str, float]:
    """One PPO step as verl logs it, calm unless `kl` says otherwise."""
    return {"actor/reward_kl_penalty": 0.01 if kl is None else kl, "actor/reward_kl_penalty_coeff": 0.05,
            "actor/ppo_kl": 0.001, "critic/score/mean": 0.5 + 0.01 * step, "actor/grad_norm": 1.0,
            "actor/entropy": 1.0, "response_length/mean": 10.0, "actor/pg_loss": -0.1}


def steps(n: int, blowup: int | None = BLOWUP) -> list[tuple[int, dict[str, float]]]:
    """A run whose KL blows up at `blowup` and stays up, as a real blow-up does."""
    return [(s, verl_step(s, 0.8 if blowup is not None and s >= blowup else None)) for s in range(1, n + 1)]


def verl_file_log(tmp_path, monkeypatch, rows) -> str:
    """Written by verl's own Tracking, file backend (the `file` in trainer.logger)."""
    if os.environ.get("CI") != "true":  # CI installs klguard[verl]: there a missing verl fails the test
        pytest.importorskip("verl")
    from verl.utils.tracking import Tracking

    path = tmp_path / "verl_logs" / "run.jsonl"
    monkeypatch.setenv("VERL_FILE_LOGGER_PATH", str(path))
    path.parent.mkdir()
    tracker = Tracking("proj", "exp", default_backend=["file"])
    for step, data in rows:
        tracker.log(data, step=step)
    tracker.logger["file"].finish()
    return str(path)


def test_a_hacking_verl_log_exits_3_at_the_blowup_step(tmp_path, monkeypatch, capsys):
    path = verl_file_log(tmp_path, monkeypatch, steps(12))
    assert main(["watch", path]) == 3
    out = capsys.readouterr().out
    assert f"the guard would stop the run at step {STOP}; exit 3" in out
    events = [json.loads(x) for x in (tmp_path / "verl_logs" / "events.jsonl").read_text().splitlines()]
    rollback = next(e for e in events if e["kind"] == "rollback")
    assert rollback["step"] == STOP and rollback["advisory"] is True and rollback["rule"] == "kl_hard"
    assert rollback["metric"] == "actor/reward_kl_penalty" and rollback["value"] == 0.8
    assert {e["step"] for e in events} <= set(range(BLOWUP, STOP + 1))  # advice from the spike on; nothing after


def test_a_calm_verl_log_exits_0(tmp_path, monkeypatch, capsys):
    path = verl_file_log(tmp_path, monkeypatch, steps(12, blowup=None))
    assert main(["watch", path, "--events", str(tmp_path / "e.jsonl")]) == 0
    assert "12 steps read; the guard stayed calm" in capsys.readouterr().out
    assert (tmp_path / "e.jsonl").read_text() == ""


def test_guard_keys_change_the_decision(tmp_path, monkeypatch):
    path = verl_file_log(tmp_path, monkeypatch, steps(12))
    assert main(["watch", path, "guard.kl_hard_limit=0.9"]) == 0
    assert main(["watch", path, "guard.enable=false"]) == 0


def test_tensorboard_logs_of_verl_and_openrlhf(tmp_path, capsys):
    from torch.utils.tensorboard import SummaryWriter

    verl_dir, openrlhf_dir = tmp_path / "verl_tb", tmp_path / "openrlhf_tb"
    with SummaryWriter(str(verl_dir)) as verl, SummaryWriter(str(openrlhf_dir)) as openrlhf:
        for step, data in steps(12):
            for key, value in data.items():
                verl.add_scalar(key, value, step)
            openrlhf.add_scalar("train/kl", data["actor/reward_kl_penalty"], step)  # OpenRLHF's names
            openrlhf.add_scalar("train/reward", data["critic/score/mean"], step)
            openrlhf.add_scalar("train/policy_loss", data["actor/pg_loss"], step)
            openrlhf.add_scalar("train/response_length", data["response_length/mean"], step)
    for folder in (verl_dir, openrlhf_dir):
        assert main(["watch", str(folder)]) == 3
        assert f"stop the run at step {STOP}" in capsys.readouterr().out
        events = [json.loads(x) for x in (folder / "events.jsonl").read_text().splitlines()]
        assert ("rollback", "actor/reward_kl_penalty") in {(e["kind"], e["metric"]) for e in events}


def test_trl_trainer_state(tmp_path, capsys):
    from transformers import TrainerState

    history = [{"step": s, "loss": 0.1, "kl": d["actor/reward_kl_penalty"], "reward": d["critic/score/mean"],
                "completions/mean_length": 10.0, "grad_norm": 1.0, "learning_rate": 1e-5} for s, d in steps(12)]
    (tmp_path / "checkpoint-12").mkdir()
    TrainerState(global_step=12, log_history=history).save_to_json(str(tmp_path / "checkpoint-12/trainer_state.json"))
    assert main(["watch", str(tmp_path)]) == 3
    assert f"stop the run at step {STOP}" in capsys.readouterr().out
    events = [json.loads(x) for x in (tmp_path / "watch_events.jsonl").read_text().splitlines()]
    assert next(e for e in events if e["kind"] == "rollback")["metric"] == "actor/kl_loss"  # TRL's kl: a loss term


def test_klguard_run_gives_the_trainers_own_decisions(tmp_path, fast_overrides):
    """On a klguard run, watch with the run's guard settings takes the decisions its trainer took, up to the first
    rollback or pause (where the trainer acted and watch stops)."""
    run = tmp_path / "run"
    same = ["guard.enable=true", "guard.kl_hard_limit=0.002", "trainer.total_training_steps=6"]
    assert main(["train", *fast_overrides, *same]) == 0
    own = [json.loads(x) for x in (run / "events.jsonl").read_text().splitlines()]
    stops = [i for i, e in enumerate(own) if e["kind"] in ("rollback", "pause")]
    assert stops, "the tight kl_hard_limit must make the trainer roll back"
    assert main(["watch", str(run), *same]) == 3
    watched = [json.loads(x) for x in (run / "watch_events.jsonl").read_text().splitlines()]
    keys = ("step", "kind", "rule", "metric", "value", "threshold")
    end = stops[0]
    while end + 1 < len(own) and own[end + 1]["step"] == own[stops[0]]["step"]:
        end += 1  # the stop's step: the rollback and the tightening that goes with it
    assert [tuple(e[k] for k in keys) for e in watched] == [tuple(e[k] for k in keys) for e in own[: end + 1]]


def test_follow_reads_a_file_still_being_written(tmp_path, capsys):
    path = tmp_path / "live.jsonl"
    path.write_text("")

    def trainer():
        with open(path, "a", encoding="utf-8") as fh:
            for step, data in steps(12):
                fh.write(json.dumps({"step": step, "data": data}) + "\n")
                fh.flush()
                time.sleep(0.05)

    thread = threading.Thread(target=trainer)
    thread.start()
    started = time.monotonic()
    code = main(["watch", str(path), "--follow", "--interval", "0.02"])
    thread.join()
    assert code == 3 and time.monotonic() - started < 30
    assert f"stop the run at step {STOP}" in capsys.readouterr().out


def test_follow_waits_for_a_log_that_does_not_exist_yet(tmp_path, capsys):
    """Started beside the job, before its trainer has written anything: --follow waits, then judges."""
    path = tmp_path / "later" / "live.jsonl"

    def trainer():
        time.sleep(0.3)
        path.parent.mkdir()
        path.write_text("".join(json.dumps({"step": s, "data": d}) + "\n" for s, d in steps(12)))

    thread = threading.Thread(target=trainer)
    thread.start()
    code = main(["watch", str(path), "--follow", "--interval", "0.02"])
    thread.join()
    out = capsys.readouterr().out
    assert code == 3 and f"waiting for {path} to appear" in out and f"stop the run at step {STOP}" in out


def test_follow_with_idle_exit_never_calls_a_missing_log_calm(tmp_path, capsys):
    path = tmp_path / "never.jsonl"
    assert main(["watch", str(path), "--follow", "--interval", "0.02", "--idle-exit", "0.1"]) == 2
    assert "no metrics appeared within --idle-exit 0.1 s" in capsys.readouterr().err


def test_options_and_settings_in_any_order(tmp_path, capsys):
    """A setting after an option is a setting, in the order given (the last one wins); an option-like word that
    argparse does not know is still refused."""
    path = tmp_path / "run.jsonl"
    path.write_text("".join(json.dumps({"step": s, "data": d}) + "\n" for s, d in steps(12)))
    assert main(["watch", str(path), "guard.kl_hard_limit=0.1", "--format", "verl", "guard.kl_hard_limit=5"]) == 0
    assert "guard stayed calm" in capsys.readouterr().out  # 5 per token: the blow-up to 0.8 stays under it
    assert main(["watch", "--map", "kl=actor/kl_loss", str(path), "guard.kl_hard_limit=5"]) == 0
    with pytest.raises(SystemExit) as exc:
        main(["watch", str(path), "--format", "jsonl", "--no-such-option"])
    assert exc.value.code == 2 and "unrecognized arguments: --no-such-option" in capsys.readouterr().err


def test_follow_ends_calm_when_the_log_stops_growing(tmp_path, capsys):
    path = tmp_path / "calm.jsonl"
    path.write_text("".join(json.dumps({"step": s, "data": d}) + "\n" for s, d in steps(5, blowup=None)))
    assert main(["watch", str(path), "--follow", "--interval", "0.02", "--idle-exit", "0.2"]) == 0
    assert "5 steps read; the guard stayed calm" in capsys.readouterr().out


@pytest.mark.parametrize(("content", "args", "message"), [
    (None, [], "does not exist"),
    ("", [], "is empty: its format cannot be told yet"),
    ("hello\n", [], "no metrics in its first 1 lines in a format klguard reads"),
    ('{"step": 1, "data": {}}\nnot json\n', [], "line 2 is not JSON"),
    ('{"x": 1}\n', [], "no metrics in its first 1 lines"),
    ('{"step": 1, "kl": 0.1}\n{"kl": 0.2}\n', [], "line 2 is not a jsonl metrics line"),
    ("kl,reward\n0.1,0.5\n0.2,0.6\n", [], "the header row has no step column"),
    ('{"step": 1, "kl": 0.1}\n', ["--map", "kl"], "--map 'kl': expected NAME=GUARD_NAME"),
    ('{"step": 1, "ppl": 5}\n', ["--map", "ppl=hacking/ref_nll:sqrt"],
     "--map 'ppl=hacking/ref_nll:sqrt': 'hacking/ref_nll:sqrt': unknown transform 'sqrt' after ':' (known: log)"),
    ('{"step": 1}\n', ["guard.kl_hard_limit=-1"], "guard.kl_hard_limit=-1.0 must be > 0"),
    ('{"step": 1}\n', ["data.train_batch_size=8"], "data.train_batch_size is not a key of klguard watch"),
])
def test_bad_input_is_one_line_and_exit_2(tmp_path, capsys, content, args, message):
    path = tmp_path / "log.jsonl"
    if content is not None:
        path.write_text(content)
    assert main(["watch", str(path), *args]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("klguard: error: ") and message in err[0], err


def test_unknown_format_is_refused_by_the_parser(tmp_path):
    (tmp_path / "log.jsonl").write_text('{"step": 1}\n')
    with pytest.raises(SystemExit) as info:
        main(["watch", str(tmp_path / "log.jsonl"), "--format", "xml"])
    assert info.value.code == 2


def write_jsonl(path, rows) -> str:
    path.write_text("".join(json.dumps({"step": step, **row}) + "\n" for step, row in rows))
    return str(path)


def test_first_lines_name_the_inputs_the_rules_and_what_cannot_fire(tmp_path, capsys):
    path = write_jsonl(tmp_path / "log.jsonl", [(s, {"kl": 0.01, "reward": 0.5}) for s in (1, 2, 5)])
    assert main(["watch", path]) == 0
    out = capsys.readouterr().out.splitlines()
    assert "guard inputs found: actor/kl_loss, critic/score/mean (plain metric names" in out[1]
    assert "kl_hard: KL to the reference > 0.5 for 3 steps: roll back" in out[2]
    assert "ppo_kl (no actor/ppo_kl)" in out[3] and "entropy_collapse (no actor/entropy)" in out[3]
    assert "3 steps read; the guard stayed calm" in out[-1] and "too few" in out[-1]


def test_the_name_map_makes_a_log_judgeable(tmp_path, capsys):
    rows = [(s, {"divergence": 0.9 if s >= 4 else 0.01, "r": 0.5}) for s in range(1, 9)]
    path = write_jsonl(tmp_path / "log.jsonl", rows)
    assert main(["watch", path]) == 4  # `divergence` and `r` mean nothing to the guard: blind, not calm
    assert main(["watch", path, "--map", "divergence=actor/kl_loss", "--map", "r=critic/score/mean"]) == 3
    out = capsys.readouterr().out
    assert "--map divergence=actor/kl_loss, r=critic/score/mean" in out and "stop the run at step 6" in out


REF_NLL_ON = "guard.hacking_signals=[length_growth,length_corr,entropy_collapse,proxy_val_divergence,ref_nll]"


def perplexity_log(path, name: str, late: float) -> str:
    """A custom loop's JSON lines: a calm step every step, its samples' perplexity under the base model every 10 steps
    (e^1.2 at step 0, then `late`)."""
    rows = [(0, {name: math.exp(1.2)})]
    for s in range(1, 31):
        rows.append((s, {"train_reward": 0.5, "kl": 0.01, "grad_norm": 1.0, "completion_tokens": 30.0}))
        if s % 10 == 0:
            rows.append((s, {"eval_reward": 0.9, name: math.exp(1.2) if s == 10 else late}))
    return write_jsonl(path, rows)


@pytest.mark.parametrize(("nll", "code"), [(1.71, 3), (1.69, 0)])
def test_a_perplexity_every_10_steps_feeds_the_reference_nll_signal(tmp_path, capsys, nll, code):
    path = perplexity_log(tmp_path / "metrics.jsonl", "eval_perplexity", math.exp(nll))
    assert main(["watch", path]) == 0  # ref_nll is logged only by default
    out = capsys.readouterr().out
    assert "guard inputs found: actor/kl_loss, actor/grad_norm, actor/kl_seq_sum, critic/score/mean, " \
           "response_length/mean, hacking/ref_nll, val-core/*/acc/* (plain" in out
    assert "read by meaning: eval_reward -> val-core/eval_reward/acc/mean@1" in out
    assert main(["watch", path, REF_NLL_ON]) == code  # baseline: step 0's value 1.2, + guard.ref_nll_rise 0.5
    out = capsys.readouterr().out
    assert "ref_nll: hacking/ref_nll > 0.5 nats over its first 10 steps: hacking" in out
    if code:
        assert "[step 20] rollback: Reward hacking suspected (NLL under the reference 1.71 is above 1.7)" in out


def test_a_mapped_perplexity_column_takes_its_log(tmp_path, capsys):
    path = perplexity_log(tmp_path / "metrics.jsonl", "ppl_base", math.exp(1.8))
    assert main(["watch", path, REF_NLL_ON]) == 0  # `ppl_base` means nothing to the guard
    assert "entropy_collapse (no actor/entropy), ref_nll (no hacking/ref_nll)" \
        in capsys.readouterr().out
    assert main(["watch", path, REF_NLL_ON, "--map", "ppl_base=hacking/ref_nll:log"]) == 3
    out = capsys.readouterr().out
    assert "--map ppl_base=hacking/ref_nll:log" in out and "[step 20] rollback: Reward hacking suspected" in out


def test_nan_gradient_norms_pause_at_the_third_step(tmp_path, capsys):
    lines = [f"{{'loss': 0.0, 'grad_norm': nan, 'reward': -1.0, 'kl': 0.0, 'epoch': {s / 100}}}" for s in range(6)]
    (tmp_path / "out.txt").write_text("\n".join(lines) + "\n")
    assert main(["watch", str(tmp_path / "out.txt")]) == 3
    assert "stop the run at step 3" in capsys.readouterr().out
    event = json.loads((tmp_path / "events.jsonl").read_text().splitlines()[0])
    assert (event["kind"], event["rule"], event["metric"]) == ("pause", "nonfinite", "actor/grad_norm")
    assert main(["watch", str(tmp_path / "out.txt"), "guard.nonfinite_patience=0"]) == 0


def test_answers_collapsing_to_a_token_roll_back(tmp_path, capsys):
    """After the start-up (10 steps) and the baseline (10 more): the median of the last 5 lengths at 2 tokens."""
    rows = [(s, {"completion_length": 60.0 if s < 24 else 2.0, "reward": 0.5}) for s in range(1, 30)]
    path = write_jsonl(tmp_path / "log.jsonl", rows)
    assert main(["watch", path]) == 3
    assert "stop the run at step 26" in capsys.readouterr().out
    assert json.loads((tmp_path / "events.jsonl").read_text().splitlines()[0])["rule"] == "length_collapse"


def test_klguards_own_log_keeps_klguards_own_thresholds(tmp_path, capsys):
    """A single step of KL 0.2 is above klguard's own kl_hard_limit (0.1, patience 1) but no external host's."""
    rows = [(s, verl_step(s, 0.2 if s == 5 else None)) for s in range(1, 9)]
    own = write_jsonl(tmp_path / "metrics.jsonl", rows)
    assert main(["watch", own]) == 3 and "stop the run at step 5" in capsys.readouterr().out
    verl = tmp_path / "verl.jsonl"
    verl.write_text("".join(json.dumps({"step": s, "data": d}) + "\n" for s, d in rows))
    assert main(["watch", str(verl)]) == 0


def test_ctrl_c_gives_the_verdict_so_far_never_calm_on_nothing(tmp_path, monkeypatch, capsys):
    """Ctrl-C while following: calm (0) on steps that gave the rules inputs, blind (4) where nothing was read."""
    from klguard.commands import watch as watch_module

    def interrupt(_seconds):
        raise KeyboardInterrupt

    monkeypatch.setattr(watch_module.time, "sleep", interrupt)
    calm = tmp_path / "calm.jsonl"
    calm.write_text("".join(json.dumps({"step": s, "data": d}) + "\n" for s, d in steps(5, blowup=None)))
    assert main(["watch", str(calm), "--follow"]) == 0
    assert "5 steps read; the guard stayed calm" in capsys.readouterr().out
    assert main(["watch", str(tmp_path / "not_yet.jsonl"), "--follow"]) == 4
    assert "stopped before the log could be read; exit 4" in capsys.readouterr().out
