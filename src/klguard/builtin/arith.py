"""The built-in arithmetic task: `23+45-7=?` -> `61`, as verl-format rows and parquet files.

Problems are `a op1 b [op2 c]` with a, b in 10..99, c in 1..9 and ops in {+, -} (see FORMS); answers are kept
non-negative (problems with a negative answer are redrawn) so the tiny model never has to learn a
leading minus. Each distinct problem belongs to exactly one split, chosen by a stable hash of its
text, so train and validation are disjoint by construction whatever the seeds and sizes.

Rows follow verl's GSM8K preprocessing (`examples/data_preprocess/gsm8k.py`): `data_source`,
`prompt` (a chat message list), `ability`, `reward_model` {style, ground_truth}, `extra_info`
{split, index, answer, question}.
"""

from __future__ import annotations

import hashlib
import random
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

DATA_SOURCE = "klguard/arith"
SPLITS: tuple[str, ...] = ("train", "val")
# Share of the problem space (in 1/1000) that the hash assigns to validation.
VAL_PER_MILLE = 100
# Rejection sampling gives up after this many draws per requested row (the split ran dry).
_MAX_DRAWS_PER_ROW = 50

# The Arrow schema that `datasets.Dataset.to_parquet` writes for verl's GSM8K rows.
ARROW_SCHEMA = pa.schema(
    [
        ("data_source", pa.string()),
        ("prompt", pa.list_(pa.struct([("role", pa.string()), ("content", pa.string())]))),
        ("ability", pa.string()),
        ("reward_model", pa.struct([("style", pa.string()), ("ground_truth", pa.string())])),
        (
            "extra_info",
            pa.struct(
                [
                    ("split", pa.string()),
                    ("index", pa.int64()),
                    ("answer", pa.string()),
                    ("question", pa.string()),
                ]
            ),
        ),
    ]
)


@dataclass(frozen=True)
class ArithProblem:
    """One problem; `c`/`op2` are None for a two-operand problem."""

    a: int
    op1: str
    b: int
    op2: str | None = None
    c: int | None = None

    @property
    def expression(self) -> str:
        """The expression without `=?`, e.g. `23+45-7`."""
        tail = f"{self.op2}{self.c}" if self.op2 is not None else ""
        return f"{self.a}{self.op1}{self.b}{tail}"

    @property
    def question(self) -> str:
        """The prompt text, e.g. `23+45-7=?`."""
        return f"{self.expression}=?"

    @property
    def answer(self) -> int:
        """The value of the expression, evaluated left to right."""
        value = _apply(self.a, self.op1, self.b)
        return value if self.op2 is None or self.c is None else _apply(value, self.op2, self.c)


def _apply(x: int, op: str, y: int) -> int:
    if op == "+":
        return x + y
    if op == "-":
        return x - y
    raise ValueError(f"unknown operator {op!r}")


def split_of(problem: ArithProblem) -> str:
    """The split that owns `problem`: a stable hash (not Python's salted `hash`) of its text."""
    digest = hashlib.blake2b(problem.expression.encode(), digest_size=8).digest()
    return "val" if int.from_bytes(digest, "big") % 1000 < VAL_PER_MILLE else "train"


def _draw_fixed(rng: random.Random) -> ArithProblem:
    return ArithProblem(rng.randint(10, 99), "+", rng.randint(10, 99), "-", rng.randint(1, 9))


def _draw_mixed(rng: random.Random) -> ArithProblem:
    a, b, op1 = rng.randint(10, 99), rng.randint(10, 99), rng.choice("+-")
    if rng.random() < 0.5:
        return ArithProblem(a, op1, b, rng.choice("+-"), rng.randint(1, 9))
    return ArithProblem(a, op1, b)


def _draw_two(rng: random.Random) -> ArithProblem:
    return ArithProblem(rng.randint(10, 99), rng.choice("+-"), rng.randint(10, 99))


# data.builtin_form: the keys, which klguard.config.schema.BuiltinForm lists too
FORMS: dict[str, Any] = {"a+b-c": _draw_fixed, "mixed": _draw_mixed, "two": _draw_two}
"""Problem families: `a+b-c` (the prototype's, which the tiny model learns within minutes: its SFT
accuracy jumps from ~0.1 to ~0.9 after about 1,300 steps of batch 64), `mixed` (two- and
three-operand sums and differences, markedly slower to learn), `two` (`a+b` or `a-b`)."""


def sample_problems(n: int, split: str, seed: int, *, form: str = "a+b-c") -> list[ArithProblem]:
    """Draw `n` distinct problems of `split` with non-negative answers, reproducibly from `seed`.

    `form` names the problem family (see FORMS).
    """
    if form not in FORMS:
        raise ValueError(f"form must be one of {', '.join(FORMS)}, got {form!r}")
    draw = FORMS[form]
    if split not in SPLITS:
        raise ValueError(f"split must be one of {SPLITS}, got {split!r}")
    if n < 0:
        raise ValueError(f"n must be >= 0, got {n}")
    # Seeded by (seed, split) so the two splits draw independent streams.
    rng = random.Random(f"klguard-arith:{seed}:{split}")
    problems: list[ArithProblem] = []
    seen: set[str] = set()
    draws = 0
    while len(problems) < n:
        if draws >= _MAX_DRAWS_PER_ROW * n + 1000:
            raise ValueError(
                f"could not draw {n} distinct {split} problems (got {len(problems)}); ask for fewer"
            )
        draws += 1
        problem = draw(rng)
        if problem.answer < 0 or problem.expression in seen or split_of(problem) != split:
            continue
        seen.add(problem.expression)
        problems.append(problem)
    return problems


def make_arith_rows(
    n: int, split: str, seed: int, *, form: str = "a+b-c"
) -> list[dict[str, Any]]:
    """Return `n` verl-format rows of the `split` split (see the module docstring for the fields)."""
    rows = []
    for index, problem in enumerate(sample_problems(n, split, seed, form=form)):
        answer = str(problem.answer)
        rows.append(
            {
                "data_source": DATA_SOURCE,
                "prompt": [{"role": "user", "content": problem.question}],
                "ability": "math",
                "reward_model": {"style": "rule", "ground_truth": answer},
                "extra_info": {
                    "split": split,
                    "index": index,
                    "answer": answer,
                    "question": problem.question,
                },
            }
        )
    return rows


def write_arith_parquet(
    out_dir: str | Path, n_train: int, n_val: int, seed: int, *, form: str = "a+b-c"
) -> tuple[Path, Path]:
    """Write `train.parquet` and `val.parquet` under `out_dir`; return their paths."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    paths = (out / "train.parquet", out / "val.parquet")
    for path, split, n in zip(paths, SPLITS, (n_train, n_val), strict=True):
        rows = make_arith_rows(n, split, seed, form=form)
        pq.write_table(pa.Table.from_pylist(rows, schema=ARROW_SCHEMA), path)
    return paths
