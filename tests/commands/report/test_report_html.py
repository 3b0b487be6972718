"""Reports from run directories: reading runs back, the summary numbers, a self-contained page."""

from __future__ import annotations

import base64
import json
import re

import pytest

from klguard.commands.cli import main
from klguard.commands.report import load_run, write_run_report
from klguard.commands.report.summary import summary_value, text_table

VAL = "val-core/klguard/arith/acc/mean@1"


def _write_run(path, rows, events=()):
    path.mkdir(parents=True)
    (path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    if events:
        (path / "events.jsonl").write_text("".join(json.dumps(e) + "\n" for e in events))
    return path


def _rows(n, hack_from=None):
    rows = [{"step": 0, VAL: 0.5}]
    for s in range(1, n + 1):
        hacking = hack_from is not None and s >= hack_from
        row = {"step": s, "hacking/rate": 0.9 if hacking else 0.1, "response_length/mean": 30.0 if hacking else 9.0,
               "actor/reward_kl_penalty": 0.01 * s, "actor/reward_kl_penalty_coeff": 0.1, "actor/lr": 1e-4,
               "hacking/proxy_score": 1.0, "hacking/gold_score": 0.5}
        if s % 5 == 0:
            row[VAL] = 0.9 - (0.5 if hacking else 0.0)
        rows.append(row)
    return rows


def test_summary_numbers_come_from_the_metrics(tmp_path):
    run = load_run(_write_run(tmp_path / "a", _rows(20, hack_from=15)))
    assert summary_value(run, "val-core/", "last") == pytest.approx(0.4)
    assert summary_value(run, "val-core/", "best") == pytest.approx(0.9)
    assert summary_value(run, "hacking/rate", "tail") == pytest.approx((6 * 0.9 + 4 * 0.1) / 10)
    assert summary_value(run, "response_length/mean", "last") == 30.0


def test_a_resumed_run_keeps_the_latest_row_of_a_repeated_step(tmp_path):
    rows = [*_rows(4), {"step": 3, "hacking/rate": 0.0}, {"step": 4, "hacking/rate": 0.0}]
    run = load_run(_write_run(tmp_path / "a", rows))
    assert [r["step"] for r in run.rows] == [0, 1, 2, 3, 4]
    assert run.series("hacking/rate")[1] == [0.1, 0.1, 0.0, 0.0]


def test_the_report_is_one_self_contained_page_with_figures_and_actions(tmp_path):
    events = [{"step": 15, "kind": "rollback", "rule": "hacking", "reason": "Reward hacking suspected <len>"}]
    a = load_run(_write_run(tmp_path / "a", _rows(20, hack_from=15), events), "guarded")
    b = load_run(_write_run(tmp_path / "b", _rows(20)), "plain")
    out = write_run_report([a, b], tmp_path / "report.html", "compare")
    page = out.read_text()
    assert "<script" not in page and "http://" not in page and "https://" not in page  # nothing to fetch
    images = re.findall(r'src="data:image/png;base64,([A-Za-z0-9+/=]+)"', page)
    assert len(images) == 1 and base64.b64decode(images[0])[:8] == b"\x89PNG\r\n\x1a\n"
    assert "Reward hacking suspected &lt;len&gt;" in page  # escaped, listed in the actions table
    assert "<th>guarded</th><th>plain</th>" in page
    table = text_table([a, b])
    assert "final validation gold" in table and "guarded" in table.splitlines()[0]


def test_report_command_writes_into_the_run_and_rejects_other_folders(tmp_path, capsys):
    run = _write_run(tmp_path / "a", _rows(6))
    assert main(["report", str(run)]) == 0
    assert (run / "report.html").is_file()
    assert main(["report", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"klguard: error: {tmp_path} is not a klguard run directory (no metrics.jsonl) nor a TRL output "
                   "folder (no trainer_state.json)"]


def test_a_corrupt_metrics_line_is_named(tmp_path, capsys):
    run = _write_run(tmp_path / "a", _rows(2))
    with open(run / "metrics.jsonl", "a") as fh:
        fh.write("{not json\n")
    assert main(["report", str(run)]) == 2
    assert "metrics.jsonl: line 4 is not JSON" in capsys.readouterr().err


def test_panels_no_run_recorded_are_named_not_drawn(tmp_path):
    """A panel no run has a metric of is left out of the figure and named once in the note under it."""
    from klguard.commands.report.figures import PANELS, SUMMARY_PANELS, recorded_panels

    runs = [load_run(_write_run(tmp_path / "a", _rows(10)))]
    drawn, missing = recorded_panels(runs)
    assert {p.title for p in missing} >= {"RM ensemble spread (gold-free signal)", "Actor gradient norm (before "
                                          "clipping)"}
    assert len(drawn) + len(missing) == len(PANELS) and "Hacking rate on rollouts" in {p.title for p in drawn}
    html = write_run_report(runs, tmp_path / "a" / "report.html").read_text()
    assert "Not recorded in this run: " in html and "RM ensemble spread (gold-free signal)" in html
    assert "not recorded" not in html.replace("Not recorded", "")
    assert recorded_panels(runs, SUMMARY_PANELS)[0] == list(SUMMARY_PANELS)


def test_header_names_runs_relative_to_the_report(tmp_path):
    inside = load_run(_write_run(tmp_path / "out" / "run_a", _rows(5)), "a")
    outside = load_run(_write_run(tmp_path / "elsewhere", _rows(5)), "b")
    html = write_run_report([inside, outside], tmp_path / "out" / "report.html").read_text()
    assert "a (run_a)" in html and f"b ({(tmp_path / 'elsewhere').resolve()})" in html
