"""Blind is not calm: a log the rules have no input in exits with its own code and a hint, a calm summary names what
no rule could see, and numbers printed in quotes are numbers. The exit codes are pinned here: scripts test them."""

from __future__ import annotations

import json
from pathlib import Path

from klguard.commands import watch
from klguard.commands.cli import build_parser, main

ROOT = Path(__file__).resolve().parents[3]


def test_the_exit_codes_are_stable_and_documented(capsys):
    assert (watch.EXIT_CALM, watch.EXIT_BAD_INPUT, watch.EXIT_STOP, watch.EXIT_BLIND) == (0, 2, 3, 4)
    assert sorted(watch.EXIT_CODES) == [0, 2, 3, 4]
    sub = next(a for a in build_parser()._actions if a.dest == "command").choices["watch"]
    helptext = " ".join(sub.format_help().split())
    assert "0 calm" in helptext and "2 bad input" in helptext and "3 the guard would roll back or pause" in helptext
    assert "4 blind: no rule could fire" in helptext
    doc = " ".join((ROOT / "docs" / "watch.md").read_text().split())
    assert "0 the guard stayed calm" in doc and "3 it would roll back or pause" in doc and "2 bad input" in doc
    assert "4 blind: no rule could fire" in doc
    assert "4 blind: no rule could fire" in " ".join(watch.__doc__.split())


def test_a_log_with_no_guard_input_is_blind_with_a_hint(tmp_path, capsys):
    rows = [{"step": s, "epoch": s / 10, "divergence": 0.5, "r": 0.1} for s in range(12)]
    path = tmp_path / "log.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert main(["watch", str(path)]) == 4
    out = capsys.readouterr().out.splitlines()
    assert out[-1] == ("klguard watch: blind: no rule could fire on 12 steps: its 3 metric names give no rule an "
                       "input (saw: divergence, epoch, r); name an input with --map, e.g. --map "
                       "divergence=critic/score/mean (guard names: docs/watch.md); exit 4")
    assert "klguard watch: rules: none" in out
    assert main(["watch", str(path), "--map", "r=critic/score/mean"]) == 0


def test_a_log_of_no_steps_is_blind(tmp_path, capsys):
    (tmp_path / "trl.out").write_text("{'loss': 'n/a', 'reward': 'n/a'}\n" * 3)  # TRL's dicts, no number in them
    assert main(["watch", str(tmp_path / "trl.out")]) == 4
    assert capsys.readouterr().out.splitlines()[-1] == (
        "klguard watch: blind: no rule could fire on 0 steps: no step with a metric was read; name an input with "
        "--map, e.g. --map NAME=critic/score/mean (guard names: docs/watch.md); exit 4")


def test_a_calm_summary_names_the_failures_no_rule_could_see(tmp_path, capsys):
    rows = [{"step": s, "reward": 0.5, "kl": 0.01} for s in range(12)]
    path = tmp_path / "log.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert main(["watch", str(path)]) == 0
    out = capsys.readouterr().out.splitlines()
    unseen = next(line for line in out if line.startswith("klguard watch: no rule could see: "))
    assert "an entropy collapse (entropy_collapse: no actor/entropy)" in unseen
    assert "a validation score falling (val_drop: no val-core/*/acc/*)" in unseen
    assert "responses collapsing to a few tokens (length_collapse: no response_length/mean)" in unseen
    assert "a KL blow-up" not in unseen and out[-1].endswith("exit 0")


def test_trl_console_dicts_with_quoted_numbers_are_numbers(tmp_path, capsys):
    """Some TRL versions print every value as a string: read as numbers, not as a log of 0 steps."""
    lines = [f"{{'loss': '0.0123', 'grad_norm': '1.5', 'reward': '0.5', 'kl': '{0.8 if s >= 4 else 0.01}', "
             f"'completion_length': '42.0', 'epoch': '{s / 100}'}}" for s in range(1, 9)]
    (tmp_path / "trl.out").write_text("\n".join(lines) + "\n")
    assert main(["watch", str(tmp_path / "trl.out")]) == 3  # KL 0.8 > 0.5 at entries 4, 5, 6
    out = capsys.readouterr().out
    found = ("actor/kl_loss, actor/grad_norm, actor/pg_loss, actor/kl_seq_sum, critic/score/mean, "
             "response_length/mean")
    assert f"guard inputs found: {found}" in out
    assert "stop the run at step 6" in out
