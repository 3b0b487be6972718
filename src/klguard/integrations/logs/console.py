"""Console output, read as printed: the line grammars no library parses.

- verl's console logger: ``step:N - name:value - name:value ...``, behind Ray's ``(TaskRunner pid=N)`` prefix and
  colour codes, values possibly wrapped as ``np.float64(...)``; validation on a line of its own for the same step,
  and the ``Initial validation metrics: {...}`` line (step 0);
- transformers' (TRL's) console dicts ``{'loss': 0.1, 'kl': 0.02, ...}``, behind tqdm's carriage-return debris,
  values possibly ``nan`` or numbers in quotes (``'0.0123'``, as some TRL versions print them). They carry no
  step: the step is tqdm's counter on the same line, else the entry's number;
- one line per step of ``name: value`` / ``name=value`` pairs, separated by anything (``|``, ``,``, spaces), the
  step read from the line (``step: 12``, ``step=12``, ``Step 12/500``). A line without a step is not a step.
"""

from __future__ import annotations

import re
from pathlib import Path

from klguard.integrations.logs.lines import LineLog, Raw, Step

ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")
RAY_PREFIX = re.compile(r"^\s*\((?:[\w.-]+ )?pid=\d+(?:, ip=[\d.]+)?\)\s*")
NUMBER = r"[-+]?(?:\d+\.?\d*(?:[eE][-+]?\d+)?|\.\d+(?:[eE][-+]?\d+)?|nan|NaN|inf|Infinity)"
PAIR = re.compile(r"""['"]?([A-Za-z_][\w./@()\[\]-]*)['"]?\s*[:=]\s*(?:np\.\w+\(|tensor\()?\s*(['"]?)(""" + NUMBER
                  + r""")\2(?![\w.])""")
"""`name: number`, `name=number`, `'name': 'number'` (some TRL versions print values as quoted strings)."""
STEP_KEYS = ("step", "global_step", "steps", "_step", "iter", "iteration", "train/global_step", "progress/step",
             "trainer/global_step", "progress/batch")
STEP_WORD = re.compile(r"(?i)\b(?:global[_ ]?)?step\s*#?\s*(\d+)\s*(?:/\s*\d+)?(?![\w.:=])")
VERL_STEP = re.compile(r"\bstep:(\d+) - ")
VERL_INITIAL = "Initial validation metrics"
TRL_DICT = re.compile(r"\{'[\w./@-]+': .*\}")
TQDM_COUNT = re.compile(r"(\d+)/\d+ \[")


def clean(line: str) -> str:
    """The line without colour codes, Ray's process prefix and what a carriage return overwrote."""
    line = ANSI.sub("", line)
    return RAY_PREFIX.sub("", line)


def pairs(text: str) -> Raw:
    """Every ``name: number`` / ``name=number`` in `text` (numbers possibly ``np.float64(...)``, ``nan``)."""
    return {name: float(value) for name, _, value in PAIR.findall(text)}


def step_of(found: Raw, text: str) -> int | None:
    """The step a line names: a step key among its pairs, else ``step 12`` / ``Step 12/500`` in its words."""
    for key in STEP_KEYS:
        for name in (key, key.capitalize(), key.upper()):
            value = found.get(name)
            if value is not None and value == value and value >= 0 and value == int(value):
                return int(value)
    match = STEP_WORD.search(text)
    return None if match is None else int(match.group(1))


def without_steps(found: Raw) -> Raw:
    return {k: v for k, v in found.items() if k.lower() not in STEP_KEYS}


class VerlConsole(LineLog):
    format, trainer = "verl-console", "verl"

    def parse(self, number: int, line: str) -> Step | None:
        text = clean(line)
        if VERL_INITIAL in text:
            found = pairs(text[text.index(VERL_INITIAL) + len(VERL_INITIAL):])
            return (0, found) if found else None
        match = VERL_STEP.search(text)
        if match is None:
            return None
        found = without_steps(pairs(text[match.start():]))
        return (int(match.group(1)), found) if found else None


class TrlConsole(LineLog):
    """One dict per logged step; the summary (`train_runtime`) and evaluation (`eval_*`) dicts are not steps."""

    format, trainer = "trl-console", "trl"
    merge = False

    def __init__(self, path: Path) -> None:
        super().__init__(path)
        self.entries = 0
        self.counted = False  # whether a step was the entry's number (no step on its line)

    def restart(self) -> None:
        super().restart()
        self.entries = 0

    def parse(self, number: int, line: str) -> Step | None:
        text = ANSI.sub("", line)
        match = TRL_DICT.search(text)
        if match is None:
            return None
        found = pairs(match.group(0))
        if not found or "train_runtime" in found or all(k.startswith("eval_") for k in found):
            return None
        self.entries += 1
        step = step_of(found, "")
        if step is None:
            counter = TQDM_COUNT.findall(text[: match.start()])
            step = int(counter[-1]) if counter else self.entries
            self.counted = self.counted or not counter
        return step, without_steps(found)


class KeyValueLines(LineLog):
    """Any trainer's one-line-per-step ``name: value`` output; the trainer is told by its metric names."""

    format, trainer = "kv-lines", None

    def parse(self, number: int, line: str) -> Step | None:
        text = clean(line)
        found = pairs(text)
        step = step_of(found, text)
        found = without_steps(found)
        return (step, found) if step is not None and found else None


def sniff(lines: list[str]) -> str | None:
    """Which console grammar these first lines follow (None: none), the most specific first: a verl step line, a
    TRL dict with a `loss` (a config dump printed as dicts has none), a line with a step and named numbers."""
    texts = [clean(line) for line in lines]
    if any(VERL_STEP.search(text) for text in texts):
        return "verl-console"
    if any(TRL_DICT.search(text) and "'loss': " in text for text in texts):
        return "trl-console"
    kv = KeyValueLines(Path())
    return "kv-lines" if any(kv.parse(0, line) is not None for line in lines) else None
