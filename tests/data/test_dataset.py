"""The verl-format parquet loader: tokenization, truncation, every DatasetError, left padding."""

from __future__ import annotations

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

from klguard.builtin.arith import write_arith_parquet
from klguard.builtin.char_tokenizer import build_char_tokenizer
from klguard.data.dataset import DatasetError, RLRow, collate_left_pad, load_rl_dataset
from klguard.errors import UserError


@pytest.fixture(scope="module")
def tok():
    return build_char_tokenizer()


def _row(question: str = "1+2=?", truth: str | None = "3") -> dict:
    reward_model = {"style": "rule", "ground_truth": truth} if truth is not None else {"style": "rule"}
    return {
        "data_source": "klguard/arith",
        "prompt": [{"role": "user", "content": question}],
        "reward_model": reward_model,
        "extra_info": {"index": 0},
    }


def _write(path, rows, schema=None):
    pq.write_table(pa.Table.from_pylist(rows, schema=schema), path)
    return path


def test_loads_arith_parquet_with_the_char_tokenizer(tok, tmp_path) -> None:
    train, val = write_arith_parquet(tmp_path, n_train=20, n_val=5, seed=0)
    ds = load_rl_dataset(str(train), tok)
    assert len(ds) == 20
    row = ds[3]
    source = pq.read_table(train).to_pylist()[3]
    question = source["prompt"][0]["content"]
    assert row.prompt_text == f"Q:{question}A:"
    assert row.input_ids == [tok.convert_tokens_to_ids(c) for c in row.prompt_text]  # no BOS added
    assert row.ground_truth == source["reward_model"]["ground_truth"]
    assert row.data_source == "klguard/arith"
    assert row.extra_info["question"] == question and row.extra_info["index"] == 3
    assert row.raw_prompt == source["prompt"]
    assert (row.source_file, row.source_index) == (str(train), 3)
    both = load_rl_dataset([train, val], tok, max_samples=22)
    assert len(both) == 22 and both[21].source_file == str(val)


def test_overlong_prompts_truncate_or_filter_like_verl(tok, tmp_path) -> None:
    path = _write(tmp_path / "p.parquet", [_row("1+2=?"), _row("12+34-5=?", "41")])
    # "Q:1+2=?A:" is 9 tokens, "Q:12+34-5=?A:" is 13.
    ids = {
        t: load_rl_dataset(path, tok, max_prompt_length=9, truncation=t)[1].input_ids
        for t in ("left", "right", "middle")
    }
    full = tok("Q:12+34-5=?A:")["input_ids"]
    assert ids["left"] == full[-9:]
    assert ids["right"] == full[:9]
    assert ids["middle"] == full[:4] + full[-5:]
    kept = load_rl_dataset(path, tok, max_prompt_length=9, filter_overlong_prompts=True)
    assert [r.ground_truth for r in kept] == ["3"]
    assert len(load_rl_dataset(path, tok, max_prompt_length=13)[1].input_ids) == 13


def test_chat_template_kwargs_reach_the_template(tok, tmp_path) -> None:
    custom = build_char_tokenizer()
    custom.chat_template = "{{ prefix }}" + custom.chat_template
    path = _write(tmp_path / "p.parquet", [_row()])
    ds = load_rl_dataset(path, custom, apply_chat_template_kwargs={"prefix": "9"})
    assert ds[0].prompt_text == "9Q:1+2=?A:"


def _error(path, tok, **kwargs) -> str:
    with pytest.raises(DatasetError) as info:
        load_rl_dataset(path, tok, **kwargs)
    message = str(info.value)
    assert "\n" not in message and str(path) in message
    return message


def test_file_level_errors_name_the_file(tok, tmp_path) -> None:
    assert "not found" in _error(tmp_path / "missing.parquet", tok)
    not_parquet = tmp_path / "notes.parquet"
    not_parquet.write_text("prompt,answer\n1+2=?,3\n")
    assert "cannot read as parquet" in _error(not_parquet, tok)
    empty = _write(tmp_path / "empty.parquet", [], schema=pa.schema([("prompt", pa.string())]))
    assert "no rows" in _error(empty, tok)
    long = _write(tmp_path / "long.parquet", [_row("12+34-5=?")])
    assert "filtered out" in _error(long, tok, max_prompt_length=5, filter_overlong_prompts=True)


def test_row_level_errors_name_file_and_row(tok, tmp_path) -> None:
    good = [_row(), _row()]
    no_prompt_col = _write(tmp_path / "a.parquet", [{k: v for k, v in r.items() if k != "prompt"} for r in good])
    assert "row 0: missing 'prompt'" in _error(no_prompt_col, tok)

    null_prompt = _write(tmp_path / "b.parquet", [*good, {**_row(), "prompt": None}])
    assert "row 2: missing 'prompt'" in _error(null_prompt, tok)

    no_truth = _write(tmp_path / "c.parquet", [_row(), _row(truth=None)])
    assert "row 1: missing 'reward_model.ground_truth'" in _error(no_truth, tok)

    string_prompt = _write(tmp_path / "d.parquet", [{**_row(), "prompt": "1+2=?"}])
    message = _error(string_prompt, tok)
    assert "row 0: 'prompt' must be a non-empty list of {role, content} messages, got str" in message

    bad_messages = _write(tmp_path / "e.parquet", [_row(), {**_row(), "prompt": [{"text": "1+2=?"}]}])
    assert "row 1: 'prompt' must be" in _error(bad_messages, tok)

    long = _write(tmp_path / "f.parquet", [_row(), _row("12+34-5=?")])
    assert "row 1: prompt has 13 tokens > max_prompt_length=10" in _error(long, tok, max_prompt_length=10)

    other_key = _write(tmp_path / "g.parquet", good)
    assert "row 0: missing 'question'" in _error(other_key, tok, prompt_key="question")


def test_dataset_error_is_a_value_error_and_a_user_error(tok, tmp_path) -> None:
    with pytest.raises(ValueError) as info:
        load_rl_dataset(tmp_path / "missing.parquet", tok)
    assert isinstance(info.value, UserError)
    with pytest.raises(ValueError, match="truncation"):
        load_rl_dataset(tmp_path / "missing.parquet", tok, truncation="sideways")


def test_collate_left_pad() -> None:
    rows = [RLRow([5, 6, 7], "1", "s", {}, [], ""), [8]]
    ids, mask = collate_left_pad(rows, pad_token_id=0)
    assert ids.dtype == mask.dtype == torch.long
    assert ids.tolist() == [[5, 6, 7], [0, 0, 8]]
    assert mask.tolist() == [[1, 1, 1], [0, 0, 1]]
    with pytest.raises(ValueError):
        collate_left_pad([], pad_token_id=0)
