"""A long CSV export, one row per metric (`run_name,metric,step,value`), as W&B's API or pandas' melt writes it."""

from __future__ import annotations

import pytest

from klguard.errors import UserError
from klguard.integrations.logs import detect_format, open_log
from klguard.integrations.logs.stores import CsvLog

LONG = """run_name,metric,step,value
lr_1e-4,eval/reward,0,0.5
lr_1e-4,eval/reward,2,0.25
lr_1e-4,train/entropy,2,1.5
lr_1e-4,train/entropy,0,1.25
lr_1e-4,mean_response_length,0,100
lr_1e-4,mean_response_length,2,
lr_1e-4,mean_response_length,1,120
"""


def test_rows_in_any_order_become_one_step_each_at_the_end(tmp_path):
    path = tmp_path / "export.csv"
    path.write_text(LONG)
    assert detect_format(path) == "csv"
    log = CsvLog(path)
    assert log.poll() == []  # a long export's step is complete only once the file is
    assert log.poll(final=True) == [(0, {"eval/reward": 0.5, "train/entropy": 1.25, "mean_response_length": 100.0}),
                                    (1, {"mean_response_length": 120.0}),
                                    (2, {"eval/reward": 0.25, "train/entropy": 1.5})]
    assert log.poll(final=True) == []  # read once


def test_names_are_then_read_by_meaning(tmp_path):
    path = tmp_path / "export.csv"
    path.write_text(LONG)
    steps = open_log(path, None, {}).poll(final=True)
    assert steps[0][1]["response_length/mean"] == 100.0 and steps[0][1]["actor/entropy"] == 1.25


def test_two_runs_in_one_file_are_refused_by_name(tmp_path):
    path = tmp_path / "two.csv"
    path.write_text(LONG + "other_run,eval/reward,0,0.1\n")
    with pytest.raises(UserError, match=r"holds 2 runs in its 'run_name' column \(lr_1e-4, other_run\)"):
        CsvLog(path).poll(final=True)


def test_a_row_without_a_step_is_named(tmp_path):
    path = tmp_path / "bad.csv"
    path.write_text("metric,step,value\nreward,0,1\nreward,x,2\n")
    with pytest.raises(UserError, match="row 3 has no step in column 'step'"):
        CsvLog(path).poll(final=True)
