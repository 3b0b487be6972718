"""Reading a text log as it is written: the complete lines appended since the last read.

A reader built on `LineLog` turns each line into a step's raw metrics (the trainer's own names) or nothing
(a line of other text); lines of one step are merged, and a step is returned once a line of another step arrives
(or at the end, `final`). A file that shrank was started over (a relaunched trainer truncates it): it is read
again from its start.
"""

from __future__ import annotations

from pathlib import Path

Raw = dict[str, float]
Step = tuple[int, Raw]


class LineLog:
    """The lines of one text file, read incrementally. Subclasses implement `parse(number, line)`."""

    format = "lines"
    merge = True  # lines of one step are merged; False: each line is a whole step, returned at once

    def __init__(self, path: Path) -> None:
        self.path = path
        self._offset = 0
        self.line = 0
        self._pending: Step | None = None

    def parse(self, number: int, line: str) -> Step | None:
        raise NotImplementedError

    def restart(self) -> None:
        """The file was started over: forget what was read (subclasses reset their own counters)."""
        self._offset, self.line, self._pending = 0, 0, None

    def text(self, final: bool) -> list[str]:
        """The complete lines appended since the last call (and, `final`, an unterminated last line)."""
        if self.path.stat().st_size < self._offset:
            self.restart()
        with open(self.path, "rb") as fh:
            fh.seek(self._offset)
            chunk = fh.read()
        end = len(chunk) if final else chunk.rfind(b"\n") + 1
        self._offset += end
        return chunk[:end].decode("utf-8", errors="replace").split("\n")[: None if final else -1]

    def poll(self, final: bool = False) -> list[Step]:
        out: list[Step] = []
        for raw in self.text(final):
            self.line += 1
            if not raw.strip():
                continue
            found = self.parse(self.line, raw)
            if found is None:
                continue
            if not self.merge:
                out.append(found)
            elif self._pending is not None and self._pending[0] == found[0]:
                self._pending[1].update(found[1])
            else:
                if self._pending is not None:
                    out.append(self._pending)
                self._pending = found
        if final and self._pending is not None:
            out.append(self._pending)
            self._pending = None
        return out


class StepBuffer:
    """Values that arrive by (step, name) in any order, as TensorBoard's, MLflow's and W&B's stores hold them: a
    step is complete once a later step has a value, or at the end (`final`)."""

    def __init__(self) -> None:
        self.pending: dict[int, Raw] = {}
        self.done = -1  # the last step returned: values for it or earlier that arrive late are dropped

    def add(self, step: int, name: str, value: float) -> None:
        if step > self.done:
            self.pending.setdefault(step, {})[name] = value

    def ready(self, final: bool) -> list[Step]:
        steps = sorted(self.pending)
        out = [(step, self.pending.pop(step)) for step in (steps if final else steps[:-1])]
        if out:
            self.done = out[-1][0]
        return out
