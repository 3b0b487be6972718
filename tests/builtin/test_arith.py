"""The arithmetic task: row format, correct answers, disjoint splits, parquet types."""

from __future__ import annotations

import re

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from klguard.builtin.arith import (
    ARROW_SCHEMA,
    ArithProblem,
    make_arith_rows,
    sample_problems,
    split_of,
    write_arith_parquet,
)

_QUESTION = re.compile(r"^(\d\d)([+-])(\d\d)(?:([+-])(\d))?=\?$")


def _evaluate(question: str) -> int:
    """Independent left-to-right evaluation of `a op b [op c]=?` from the question text."""
    m = _QUESTION.match(question)
    assert m is not None, question
    a, op1, b, op2, c = m.groups()
    value = int(a) + int(b) if op1 == "+" else int(a) - int(b)
    if op2 is not None:
        value = value + int(c) if op2 == "+" else value - int(c)
    return value


def test_rows_have_verls_gsm8k_format() -> None:
    rows = make_arith_rows(50, "train", seed=0)
    assert len(rows) == 50
    for i, row in enumerate(rows):
        assert set(row) == {"data_source", "prompt", "ability", "reward_model", "extra_info"}
        assert row["data_source"] == "klguard/arith" and row["ability"] == "math"
        (message,) = row["prompt"]
        assert message["role"] == "user"
        question = message["content"]
        truth = row["reward_model"]["ground_truth"]
        assert row["reward_model"]["style"] == "rule"
        assert row["extra_info"] == {"split": "train", "index": i, "answer": truth, "question": question}
        m = _QUESTION.match(question)
        assert m is not None and m.group(4) is not None  # default: always a third operand
        assert 10 <= int(m.group(1)) <= 99 and 10 <= int(m.group(3)) <= 99 and 1 <= int(m.group(5)) <= 9


def test_ground_truth_is_the_value_of_the_expression() -> None:
    rows = make_arith_rows(2000, "train", seed=1, form="mixed")
    answers = [int(r["reward_model"]["ground_truth"]) for r in rows]
    assert answers == [_evaluate(r["prompt"][0]["content"]) for r in rows]
    assert min(answers) >= 0  # negative-answer problems are redrawn
    assert any(a < 10 for a in answers) and any(a >= 100 for a in answers)
    n_three = sum(_QUESTION.match(r["prompt"][0]["content"]).group(4) is not None for r in rows)
    assert 800 < n_three < 1200


def test_problem_value_left_to_right() -> None:
    assert ArithProblem(23, "+", 45, "-", 7).answer == 61
    assert ArithProblem(12, "-", 10, "-", 5).answer == -3
    assert ArithProblem(12, "-", 10).question == "12-10=?"


def test_splits_are_disjoint_whatever_the_seeds() -> None:
    train = {r["extra_info"]["question"] for r in make_arith_rows(5000, "train", seed=0)}
    val = {r["extra_info"]["question"] for seed in (0, 1, 2) for r in make_arith_rows(500, "val", seed)}
    assert len(train) == 5000  # distinct within a split
    assert train.isdisjoint(val)
    assert all(split_of(p) == "val" for p in sample_problems(200, "val", seed=3))


def test_rows_are_reproducible_and_seed_dependent() -> None:
    assert make_arith_rows(30, "val", seed=4) == make_arith_rows(30, "val", seed=4)
    assert make_arith_rows(30, "val", seed=4) != make_arith_rows(30, "val", seed=5)


def test_bad_arguments_are_refused() -> None:
    with pytest.raises(ValueError, match="split"):
        make_arith_rows(1, "test", seed=0)
    pool = [ArithProblem(a, op, b) for a in range(10, 100) for op in "+-" for b in range(10, 100)]
    n_val_pool = sum(p.answer >= 0 and split_of(p) == "val" for p in pool)
    assert 900 < n_val_pool < 1500  # ~10% of the 12k non-negative two-operand problems
    with pytest.raises(ValueError, match="ask for fewer"):
        sample_problems(n_val_pool + 1, "val", seed=0, form="two")


def test_parquet_has_verls_arrow_types(tmp_path) -> None:
    train_path, val_path = write_arith_parquet(tmp_path / "d", n_train=40, n_val=10, seed=0)
    assert (train_path.name, val_path.name) == ("train.parquet", "val.parquet")
    train, val = pq.read_table(train_path), pq.read_table(val_path)
    assert (train.num_rows, val.num_rows) == (40, 10)
    for table in (train, val):
        assert table.schema.field("prompt").type.equals(ARROW_SCHEMA.field("prompt").type)
        assert pa.types.is_list(table.schema.field("prompt").type)
        assert pa.types.is_struct(table.schema.field("reward_model").type)
        assert table.schema.field("extra_info").type.field("index").type == pa.int64()
    assert train.to_pylist() == make_arith_rows(40, "train", seed=0)
    assert val.to_pylist() == make_arith_rows(10, "val", seed=0)
