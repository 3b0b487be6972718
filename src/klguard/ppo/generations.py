"""verl's generation dumps: with `trainer.rollout_data_dir` (each step's rollouts) or `trainer.validation_data_dir`
(each validation's responses) set, the trainer writes `<dir>/<step>.jsonl`, one line per response, with verl's
fields: `input` (the prompt as the model read it), `output`, `gts` (the row's ground truth), `score` (the reward
function's score, before the KL penalty) and `step`; klguard adds `prompt` (the last user message), `tokens`, and,
where the task has a gold, `gold` and `hacked`. A validation made before training is step 0."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING

from klguard.errors import UserError
from klguard.files import atomic_write_text

if TYPE_CHECKING:  # types only: `klguard report` reads dumps without the engine's imports
    from klguard.ppo.rollout import RolloutBatch
    from klguard.reward.manager import RewardOutput


def decode_responses(tokenizer, out: RolloutBatch) -> list[str]:
    """Each row's response text: its valid tokens, special tokens dropped."""
    return tokenizer.batch_decode(
        out.response_ids.masked_fill(out.response_mask == 0, tokenizer.pad_token_id).cpu(), skip_special_tokens=True)


def generation_records(tokenizer, rows, out: RolloutBatch, reward: RewardOutput, step: int) -> list[dict]:
    """One dump line per response of `out` (rows in the batch's order)."""
    inputs = tokenizer.batch_decode(out.prompt_ids.masked_fill(out.prompt_mask == 0, tokenizer.pad_token_id).cpu(),
                                    skip_special_tokens=True)
    outputs = decode_responses(tokenizer, out)
    records = []
    for i, row in enumerate(rows):
        record = {"input": inputs[i], "output": outputs[i], "gts": row.ground_truth,
                  "score": float(reward.scores[i]), "step": step, "prompt": _last_user_message(row.raw_prompt),
                  "tokens": int(out.response_lengths[i])}
        if reward.gold is not None:
            record |= {"gold": float(reward.gold[i]), "hacked": bool(reward.hacked[i])}
        records.append(record)
    return records


def write_generations(folder: str | Path, step: int, records: list[dict]) -> Path:
    """`<folder>/<step>.jsonl`, written whole (a crash never leaves half a file)."""
    path = Path(folder).expanduser() / f"{step}.jsonl"
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_text(path, "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records))
    except OSError as exc:
        raise UserError(f"cannot write generations to {path}: {exc.strerror or exc}") from None
    return path


def read_generations(folder: str | Path) -> dict[int, list[dict]]:
    """The dumps in `folder` by step (files not named `<step>.jsonl` are left alone)."""
    found: dict[int, list[dict]] = {}
    for path in sorted(Path(folder).glob("*.jsonl")):
        if not path.stem.isdigit():
            continue
        lines = []
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            if line.strip():
                try:
                    lines.append(json.loads(line))
                except json.JSONDecodeError as exc:
                    raise UserError(f"{path}: line {number} is not JSON ({exc.msg})") from None
        found[int(path.stem)] = lines
    return dict(sorted(found.items()))


def _last_user_message(raw_prompt) -> str | None:
    if isinstance(raw_prompt, str):
        return raw_prompt
    users = [m.get("content") for m in raw_prompt or () if isinstance(m, dict) and m.get("role") == "user"]
    return users[-1] if users else None
