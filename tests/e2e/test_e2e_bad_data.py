"""Bad datasets stop `klguard train` with one line naming the file and row, exit code 2, before any SFT."""

from __future__ import annotations

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from klguard.builtin.arith import make_arith_rows
from klguard.commands.cli import main


def _write(path, rows):
    pq.write_table(pa.Table.from_pylist(rows), path)
    return path


@pytest.fixture
def good_val(tmp_path):
    return _write(tmp_path / "val.parquet", make_arith_rows(8, "val", 0))


def _train(tmp_path, train, val, *extra):
    return main(["train", f"data.train_files={train}", f"data.val_files={val}", f"sft.cache_dir={tmp_path / 'c'}",
                 f"trainer.default_local_dir={tmp_path / 'run'}", "trainer.progress_bar=false", "sft.steps=5",
                 *extra])


def _one_error_line(capsys) -> str:
    lines = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert len(lines) == 1, lines
    return lines[0]


def test_row_missing_prompt(tmp_path, good_val, capsys):
    rows = make_arith_rows(4, "train", 0)
    rows[2]["prompt"] = None
    train = _write(tmp_path / "train.parquet", rows)
    assert _train(tmp_path, train, good_val) == 2
    assert _one_error_line(capsys) == f"klguard: error: {train}: row 2: missing 'prompt'"


def test_row_missing_ground_truth(tmp_path, good_val, capsys):
    rows = make_arith_rows(4, "train", 0)
    rows[3]["reward_model"] = {"style": "rule", "ground_truth": None}
    train = _write(tmp_path / "train.parquet", rows)
    assert _train(tmp_path, train, good_val) == 2
    assert _one_error_line(capsys) == f"klguard: error: {train}: row 3: missing 'reward_model.ground_truth'"


def test_empty_dataset(tmp_path, good_val, capsys):
    schema = pa.Table.from_pylist(make_arith_rows(1, "train", 0)).schema
    train = tmp_path / "empty.parquet"
    pq.write_table(schema.empty_table(), train)
    assert _train(tmp_path, train, good_val) == 2
    assert _one_error_line(capsys) == f"klguard: error: {train}: file has no rows"


def test_overlong_prompt_with_truncation_error(tmp_path, good_val, capsys):
    rows = make_arith_rows(4, "train", 0)
    rows[1]["prompt"] = [{"role": "user", "content": "1+1=?" * 40}]
    train = _write(tmp_path / "train.parquet", rows)
    assert _train(tmp_path, train, good_val, "data.max_prompt_length=64") == 2
    line = _one_error_line(capsys)
    assert line.startswith(f"klguard: error: {train}: row 1: prompt has ") and "max_prompt_length=64" in line


def test_missing_file(tmp_path, good_val, capsys):
    assert _train(tmp_path, tmp_path / "nope.parquet", good_val) == 2
    assert "nope.parquet: data file not found" in _one_error_line(capsys)


def test_batch_larger_than_the_dataset(tmp_path, good_val, capsys):
    train = _write(tmp_path / "train.parquet", make_arith_rows(4, "train", 0))
    assert _train(tmp_path, train, good_val, "data.train_batch_size=8",
                  "actor_rollout_ref.actor.ppo_mini_batch_size=8") == 2
    assert _one_error_line(capsys) == (
        "klguard: error: data.train_batch_size=8 is larger than the training set (4 prompts)")
