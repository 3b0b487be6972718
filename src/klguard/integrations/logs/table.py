"""Tables of numbers as a notebook prints them and as they are pasted into issues: a header row naming the columns
(one of them the step: `Step`, `global_step`, `iter`, ...) then one row of numbers per logged step.

- pipe tables: `Step | Training Loss | reward | ...`, with or without the outer pipes; markdown separator rows
  (`|---|---|`, `-- | --`) are skipped;
- whitespace tables: columns apart by tabs or runs of spaces (`Step  Training Loss  reward`). Where the header's
  names are one space apart, the row's column count decides: transformers' two-word headers (`Training Loss`,
  `Validation Loss`) are kept whole, and `rewards / fn` is one name.

A column name is read as printed, with the spaces around `/` removed (`rewards / fn` is `rewards/fn`). A cell that
is not a number (`No log`) is no value. A header row counts only where a row of numbers comes next; once it has,
lines of other text among the rows are skipped, and a new header row starts a new table.
"""

from __future__ import annotations

import re
from pathlib import Path

from klguard.integrations.logs.console import STEP_KEYS
from klguard.integrations.logs.lines import LineLog, Step

SEPARATOR_CELL = re.compile(r"^:?-{2,}:?$")
TWO_WORD = ("Training Loss", "Validation Loss")
"""transformers' notebook headers of two words."""
STEP_HEADERS = (*STEP_KEYS, "iter.")


def cells(text: str) -> list[str]:
    """A line's cells: split at `|` where it has one, else at tabs or runs of two spaces or more."""
    text = text.strip()
    if "|" in text:
        return [cell.strip() for cell in text.strip("|").split("|")]
    return [cell for cell in re.split(r"\t+|\s{2,}", text) if cell]


def number(cell: str) -> float | None:
    try:
        return float(cell)
    except ValueError:
        return None


def separator(text: str) -> bool:
    found = cells(text)
    return len(found) > 1 and all(SEPARATOR_CELL.match(cell) for cell in found)


def rows(text: str) -> list[list[float | None]]:
    """The ways to read a line as a row of numbers (None where a cell is not one): at least two cells, most of them
    numbers. A row without `|` or tabs is split at any space, else (a `No log` cell) at runs of two spaces or more."""
    splits = [cells(text)] if "|" in text or "\t" in text else [text.split(), cells(text)]
    out = []
    for found in splits:
        numbers = [number(cell) for cell in found]
        if len(numbers) > 1 and sum(n is not None for n in numbers) * 2 > len(numbers):
            out.append(numbers)
    return out


def header(text: str) -> bool:
    """Whether a line may head a table: two cells or more, none a number, one of them a step."""
    found = cells(text) if "|" in text else text.split()
    return (len(found) > 1 and all(number(cell) is None for cell in found)
            and any(cell.lower() in STEP_HEADERS for cell in found))


def column_names(text: str, count: int) -> list[str] | None:
    """The header's `count` column names, or None where it cannot be split into that many."""
    found = cells(text)
    if len(found) != count and "|" not in text:
        found = _merged(text.split())
    if len(found) != count:
        return None
    return [re.sub(r"\s*/\s*", "/", " ".join(cell.split())) for cell in found]


def _merged(words: list[str]) -> list[str]:
    """Single-space header words joined where they name one column: `rewards / fn`, `Training Loss`."""
    out: list[str] = []
    for word in words:
        if out and (word == "/" or out[-1].endswith("/")):
            out[-1] += word
        elif out and f"{out[-1]} {word}" in TWO_WORD:
            out[-1] = f"{out[-1]} {word}"
        else:
            out.append(word)
    return out


class TableLog(LineLog):
    """A header row, then one row of numbers per step; the step is the header's step column."""

    format, trainer = "table", None
    merge = False

    def __init__(self, path: Path) -> None:
        super().__init__(path)
        self.head: str | None = None  # the last header row
        self.columns: list[str] | None = None

    def restart(self) -> None:
        super().restart()
        self.head = self.columns = None

    def parse(self, number: int, line: str) -> Step | None:
        text = line.strip()
        if not text or separator(text):
            return None
        found = rows(text)
        if not found:
            if header(text):
                self.head, self.columns = text, None
            elif self.columns is None:
                self.head = None  # a header is one when a row of numbers comes next
            return None
        if self.head is None:
            return None
        if self.columns is None:
            self.columns = next((names for row in found if (names := column_names(self.head, len(row)))), None)
            if self.columns is None:
                self.head = None
                return None
        row = next((row for row in found if len(row) == len(self.columns)), None)
        return None if row is None else self._step(row)

    def _step(self, row: list[float | None]) -> Step | None:
        at = next((i for i, name in enumerate(self.columns) if name.lower() in STEP_HEADERS), None)
        step = None if at is None else row[at]
        if step is None or step < 0 or step != int(step):
            return None
        return int(step), {name: value for i, (name, value) in enumerate(zip(self.columns, row, strict=True))
                           if i != at and value is not None}


def table_format(lines: list[str]) -> str | None:
    """"table" when these first lines hold a header row and a row of numbers under it."""
    table = TableLog(Path())
    return "table" if any(table.parse(0, line) is not None for line in lines) else None
