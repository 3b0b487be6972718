"""The report's sampled-responses panel: which validations it shows, what it reads, what it refuses."""

from __future__ import annotations

import json

import pytest

from klguard.commands.report import load_run, write_run_report
from klguard.commands.report.samples import SHOWN, chosen_validations, samples_section
from klguard.errors import UserError
from klguard.ppo.generations import read_generations, write_generations


def _run_with_dumps(tmp_path, golds_by_step: dict[int, list[float]], *, config=True):
    run = tmp_path / "run"
    run.mkdir()
    (run / "metrics.jsonl").write_text(json.dumps({"step": 0}) + "\n")
    dumps = run / "validation_generations"
    for step, golds in golds_by_step.items():
        write_generations(dumps, step, [{"input": "user\nq", "prompt": f"q{i}", "output": f"answer {step}.{i} <&>",
                                         "gts": "x", "score": 2 * g, "step": step, "gold": g}
                                        for i, g in enumerate(golds)])
    if config:
        (run / "config.yaml").write_text(f"trainer:\n  validation_data_dir: {dumps}\n")
    return load_run(run)


def test_the_panel_shows_the_first_the_best_by_gold_and_the_last_validation(tmp_path):
    run = _run_with_dumps(tmp_path, {0: [0, 0, 0, 1], 5: [1, 1, 1, 0], 10: [1, 1, 0, 0], 15: [0, 0, 0, 0]})
    assert chosen_validations(run) == [("first", 0), ("best mean gold", 5), ("last", 15)]
    body = samples_section([run])
    assert body.count("<tr><td class=l>") == 3 * SHOWN
    assert "answer 5.0 &lt;&amp;&gt;" in body and "mean gold 0.75" in body
    assert "answer 10.0" not in body  # neither first, best nor last


def test_one_validation_is_shown_once_with_every_label(tmp_path):
    run = _run_with_dumps(tmp_path, {0: [0.5, 0.5]})
    assert chosen_validations(run) == [("first, best mean gold, last", 0)]


def test_no_dumps_no_panel(tmp_path):
    run = _run_with_dumps(tmp_path, {0: [1.0]}, config=False)  # dumps on disk, but the config names none
    assert run.generations == {} and samples_section([run]) is None
    page = write_run_report([run], tmp_path / "r.html").read_text()
    assert "Sampled responses" not in page


def test_the_report_carries_the_panel(tmp_path):
    run = _run_with_dumps(tmp_path, {0: [0.0], 2: [1.0]})
    page = write_run_report([run], tmp_path / "r.html").read_text()
    assert page.index("<h2>Sampled responses</h2>") < page.index("<h2>Guard actions</h2>")


def test_a_damaged_dump_is_one_line_naming_the_file_and_line(tmp_path):
    (tmp_path / "3.jsonl").write_text('{"output": "a"}\n{not json\n')
    (tmp_path / "notes.jsonl").write_text("anything")  # not a step's dump: left alone
    with pytest.raises(UserError, match=r"3\.jsonl: line 2 is not JSON"):
        read_generations(tmp_path)


def test_an_unwritable_dump_folder_is_a_user_error(tmp_path):
    (tmp_path / "file").write_text("")
    with pytest.raises(UserError, match=r"cannot write generations to .*file"):
        write_generations(tmp_path / "file" / "sub", 1, [{"output": "a"}])
