"""Load verl-format RL parquet files into tokenized prompts.

A row is what verl's preprocessing scripts write: `prompt` (a list of {role, content} messages),
`data_source`, `reward_model.ground_truth` and optional `extra_info`. Each prompt is rendered with
the tokenizer's chat template (`add_generation_prompt=True`) and tokenized without adding special
tokens, so the ids are exactly what the template wrote. Overlong prompts follow verl's
`data.truncation` (`error`, `left`, `right`, `middle`) unless `filter_overlong_prompts` drops them.

Every problem with the data raises `DatasetError`, a one-line message naming the file (and the row
index within that file when a row is at fault).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Literal, get_args

import pyarrow as pa
import pyarrow.parquet as pq
import torch
from transformers import PreTrainedTokenizerBase

from klguard.errors import UserError

Truncation = Literal["error", "left", "right", "middle"]  # data.truncation, as verl
TRUNCATIONS: tuple[str, ...] = get_args(Truncation)


class DatasetError(UserError, ValueError):
    """A data file or one of its rows is unusable; the message is one line naming file and row."""


@dataclass(frozen=True)
class RLRow:
    """One tokenized prompt with what the reward function needs."""

    input_ids: list[int]
    ground_truth: str
    data_source: str
    extra_info: dict[str, Any]
    raw_prompt: list[dict[str, str]]
    prompt_text: str
    source_file: str = ""
    source_index: int = -1


@dataclass
class RLDataset:
    """A list of `RLRow`s loaded from one or more parquet files."""

    rows: list[RLRow] = field(default_factory=list)

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, index: int) -> RLRow:
        return self.rows[index]


def _one_line(text: str, limit: int = 120) -> str:
    """Flatten a value's repr for an error message (one line, bounded length)."""
    flat = " ".join(str(text).split())
    return flat if len(flat) <= limit else flat[: limit - 3] + "..."


def _read_rows(path: Path) -> list[dict[str, Any]]:
    if not path.is_file():
        raise DatasetError(f"{path}: data file not found")
    try:
        table = pq.read_table(path)
    except (pa.ArrowException, OSError) as exc:
        raise DatasetError(f"{path}: cannot read as parquet ({_one_line(exc)})") from exc
    return table.to_pylist()


def _check_prompt(prompt: Any, where: str, prompt_key: str) -> list[dict[str, str]]:
    if prompt is None:
        raise DatasetError(f"{where}: missing '{prompt_key}'")
    ok = isinstance(prompt, list) and len(prompt) > 0
    ok = ok and all(
        isinstance(m, dict) and isinstance(m.get("role"), str) and isinstance(m.get("content"), str)
        for m in prompt
    )
    if not ok:
        raise DatasetError(
            f"{where}: '{prompt_key}' must be a non-empty list of {{role, content}} messages, "
            f"got {type(prompt).__name__} {_one_line(repr(prompt), 60)}"
        )
    return [{"role": m["role"], "content": m["content"]} for m in prompt]


def _ground_truth(row: dict[str, Any], where: str) -> str:
    reward_model = row.get("reward_model")
    truth = reward_model.get("ground_truth") if isinstance(reward_model, dict) else None
    if truth is None:
        raise DatasetError(f"{where}: missing 'reward_model.ground_truth'")
    return str(truth)


def _fit_length(ids: list[int], max_len: int, truncation: str, where: str) -> list[int]:
    """Apply verl's truncation rule to an overlong prompt."""
    if truncation == "left":
        return ids[-max_len:]
    if truncation == "right":
        return ids[:max_len]
    if truncation == "middle":
        head = max_len // 2
        return ids[:head] + ids[len(ids) - (max_len - head) :]
    raise DatasetError(
        f"{where}: prompt has {len(ids)} tokens > max_prompt_length={max_len} "
        "(set data.truncation or data.filter_overlong_prompts)"
    )


def _row_to_rl(
    row: dict[str, Any],
    where: str,
    tokenizer: PreTrainedTokenizerBase,
    prompt_key: str,
    template_kwargs: dict[str, Any],
) -> RLRow:
    """Validate and tokenize one row (no truncation yet)."""
    messages = _check_prompt(row.get(prompt_key), where, prompt_key)
    ground_truth = _ground_truth(row, where)
    data_source = row.get("data_source")
    if not isinstance(data_source, str) or not data_source:
        raise DatasetError(f"{where}: missing 'data_source' (the reward function is chosen by it)")
    try:
        text = tokenizer.apply_chat_template(
            messages, add_generation_prompt=True, tokenize=False, **template_kwargs
        )
    except Exception as exc:  # a template error is a data problem here: name the row
        raise DatasetError(f"{where}: chat template failed ({_one_line(exc)})") from exc
    ids = list(tokenizer(text, add_special_tokens=False)["input_ids"])
    extra = row.get("extra_info")
    return RLRow(
        input_ids=ids,
        ground_truth=ground_truth,
        data_source=data_source,
        extra_info=dict(extra) if isinstance(extra, dict) else {},
        raw_prompt=messages,
        prompt_text=text,
    )


def load_rl_dataset(
    files: str | Path | Sequence[str | Path],
    tokenizer: PreTrainedTokenizerBase,
    *,
    prompt_key: str = "prompt",
    max_prompt_length: int = 512,
    filter_overlong_prompts: bool = False,
    truncation: str = "error",
    apply_chat_template_kwargs: dict[str, Any] | None = None,
    max_samples: int = -1,
) -> RLDataset:
    """Read verl-format parquet `files` and tokenize their prompts (see the module docstring).

    `max_samples` > 0 keeps the first that many rows (after filtering), in file order.
    """
    if truncation not in TRUNCATIONS:
        raise ValueError(f"truncation must be one of {TRUNCATIONS}, got {truncation!r}")
    paths = [Path(files)] if isinstance(files, str | Path) else [Path(f) for f in files]
    if not paths:
        raise DatasetError("no data files given")
    template_kwargs = dict(apply_chat_template_kwargs or {})
    rows: list[RLRow] = []
    for path in paths:
        raw_rows = _read_rows(path)
        if not raw_rows:
            raise DatasetError(f"{path}: file has no rows")
        kept = 0
        for index, raw in enumerate(raw_rows):
            where = f"{path}: row {index}"
            row = _row_to_rl(raw, where, tokenizer, prompt_key, template_kwargs)
            ids = row.input_ids
            if len(ids) > max_prompt_length:
                if filter_overlong_prompts:
                    continue  # verl drops these before training; the count is checked below
                ids = _fit_length(ids, max_prompt_length, truncation, where)
            rows.append(replace(row, input_ids=ids, source_file=str(path), source_index=index))
            kept += 1
        if kept == 0:
            raise DatasetError(
                f"{path}: all {len(raw_rows)} rows are longer than max_prompt_length={max_prompt_length} "
                "and were filtered out"
            )
    if max_samples > 0:
        rows = rows[:max_samples]
    return RLDataset(rows)


def collate_left_pad(
    rows: Sequence[RLRow | Sequence[int]], pad_token_id: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Left-pad prompts to the longest one: `(input_ids [B, P], attention_mask [B, P])`, int64.

    Left padding keeps every prompt's last token in the last column, where generation continues.
    """
    seqs = [list(r.input_ids) if isinstance(r, RLRow) else list(r) for r in rows]
    if not seqs:
        raise ValueError("collate_left_pad needs at least one row")
    width = max(len(s) for s in seqs)
    input_ids = torch.full((len(seqs), width), pad_token_id, dtype=torch.long)
    attention_mask = torch.zeros((len(seqs), width), dtype=torch.long)
    for i, seq in enumerate(seqs):
        if seq:
            input_ids[i, width - len(seq) :] = torch.tensor(seq, dtype=torch.long)
            attention_mask[i, width - len(seq) :] = 1
    return input_ids, attention_mask
