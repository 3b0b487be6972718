"""The character tokenizer: vocabulary, exact round trips, chat template, save/load."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from transformers import AutoTokenizer

from klguard.builtin.char_tokenizer import TASK_CHARACTERS, build_char_tokenizer

_TOK = build_char_tokenizer()


@pytest.fixture(scope="module")
def tok():
    return _TOK


def test_vocabulary_is_specials_plus_task_characters(tok) -> None:
    assert len(tok) == 23
    assert (tok.pad_token_id, tok.bos_token_id, tok.eos_token_id, tok.unk_token_id) == (0, 1, 2, 3)
    assert (tok.pad_token, tok.bos_token, tok.eos_token, tok.unk_token) == ("<pad>", "<s>", "</s>", "<unk>")
    ids = [tok.convert_tokens_to_ids(c) for c in TASK_CHARACTERS]
    assert sorted(ids) == list(range(4, 23))
    assert tok.padding_side == "left"


def test_answer_round_trips_exactly_one_token_per_character(tok) -> None:
    ids = tok("#### 61")["input_ids"]
    assert len(ids) == 7  # no BOS/EOS added by __call__
    assert tok.unk_token_id not in ids
    assert ids[:4] == [tok.convert_tokens_to_ids("#")] * 4
    assert tok.decode(ids) == "#### 61"


def test_eos_in_text_is_one_special_token_and_unknown_chars_are_unk(tok) -> None:
    ids = tok("#### 61</s>")["input_ids"]
    assert ids[-1] == tok.eos_token_id and len(ids) == 8
    assert tok.decode(ids, skip_special_tokens=True) == "#### 61"
    assert tok("x\n")["input_ids"] == [tok.unk_token_id, tok.unk_token_id]


def test_chat_template_renders_prompt_and_sft_target(tok) -> None:
    user = [{"role": "user", "content": "23+45-7=?"}]
    text = tok.apply_chat_template(user, add_generation_prompt=True, tokenize=False)
    assert text == "Q:23+45-7=?A:"
    full = [*user, {"role": "assistant", "content": "#### 61"}]
    assert tok.apply_chat_template(full, tokenize=False) == "Q:23+45-7=?A:#### 61</s>"
    assert tok.apply_chat_template(user, tokenize=False) == "Q:23+45-7=?"
    ids = tok(text, add_special_tokens=False)["input_ids"]
    assert tok.unk_token_id not in ids and len(ids) == len(text)


def test_chat_template_refuses_unknown_roles(tok) -> None:
    with pytest.raises(Exception, match="unsupported role system"):
        tok.apply_chat_template([{"role": "system", "content": "1"}], tokenize=False)


def test_batch_padding_is_on_the_left(tok) -> None:
    batch = tok(["1", "123"], padding=True)
    assert batch["input_ids"][0][:2] == [0, 0]
    assert batch["attention_mask"] == [[0, 0, 1], [1, 1, 1]]


def test_save_and_reload_gives_identical_encodings_and_template(tok, tmp_path) -> None:
    tok.save_pretrained(tmp_path)
    again = AutoTokenizer.from_pretrained(tmp_path)
    texts = ["Q:23+45-7=?A:", "#### 61 Q:12+34-5=?A:#### 41</s>", "<s>9", "x#"]
    for text in texts:
        assert again(text)["input_ids"] == tok(text)["input_ids"]
        assert again.decode(again(text)["input_ids"]) == tok.decode(tok(text)["input_ids"])
    msgs = [{"role": "user", "content": "1+2=?"}, {"role": "assistant", "content": "#### 3"}]
    assert again.apply_chat_template(msgs, tokenize=False) == tok.apply_chat_template(msgs, tokenize=False)
    assert again.padding_side == "left"
    assert (again.pad_token_id, again.eos_token_id, len(again)) == (0, 2, 23)


@settings(max_examples=200, deadline=None)
@given(st.text(alphabet=st.sampled_from(TASK_CHARACTERS), max_size=40))
def test_any_task_string_round_trips(text: str) -> None:
    ids = _TOK(text)["input_ids"]
    assert len(ids) == len(text)
    assert _TOK.decode(ids) == text
