"""Progress of a run: a live tqdm bar on a terminal, plain lines in a log.

Redirected to a file, a tqdm bar is a carriage-return stream (thousands of redraws on a few long
lines). When the stream is not a terminal, `Progress` prints one ordinary line each time the run
passes another `every` steps (default: a tenth of the run), with the same figures the bar shows.
"""

from __future__ import annotations

import sys
import time
from typing import TextIO

from tqdm import tqdm

__all__ = ["Progress", "format_duration"]


def format_duration(seconds: float) -> str:
    """`42s`, `3m05s`, `1h02m`."""
    whole = max(0, round(seconds))
    if whole < 60:
        return f"{whole}s"
    minutes, secs = divmod(whole, 60)
    if minutes < 60:
        return f"{minutes}m{secs:02d}s"
    hours, minutes = divmod(minutes, 60)
    return f"{hours}h{minutes:02d}m"


def _is_terminal(stream: TextIO) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):  # closed or not a real stream
        return False


class Progress:
    """Steps done out of `total`, shown live (terminal) or as plain lines (log); off when not `enabled`."""

    def __init__(self, total: int, *, desc: str, initial: int = 0, enabled: bool = True, every: int = 0,
                 stream: TextIO | None = None, live: bool | None = None) -> None:
        self.stream = stream if stream is not None else sys.stderr
        self.total, self.desc, self.enabled = max(0, total), desc, enabled
        self.live = enabled and (_is_terminal(self.stream) if live is None else live)
        self.every = every if every > 0 else max(1, -(-self.total // 10))
        self.n = self._shown = self._start_n = initial
        self._started = time.monotonic()
        self._figures = ""
        self._bar = (tqdm(total=total, initial=initial, desc=desc, unit="step", file=self.stream,
                          dynamic_ncols=True) if self.live else None)

    def update(self, n: int, figures: dict[str, str] | str = "") -> None:
        """The run is at step `n` (absolute); `figures` are the bar's postfix (name -> formatted value)."""
        self.n = min(n, self.total) if self.total else n
        self._figures = figures if isinstance(figures, str) else " ".join(f"{k}={v}" for k, v in figures.items())
        if self._bar is not None:
            self._bar.n = self.n
            self._bar.set_postfix_str(self._figures, refresh=False)
            self._bar.refresh()
        elif self.enabled and self.n // self.every > self._shown // self.every:
            self._line()

    def _line(self) -> None:
        self._shown = self.n
        elapsed = time.monotonic() - self._started
        text = f"{self.desc}: {self.n}/{self.total} steps"
        if self.total:
            text += f" ({100 * self.n // self.total}%)"
        text += f", {format_duration(elapsed)} elapsed"
        done = self.n - self._start_n
        if done > 0 and self.n < self.total:
            text += f", ~{format_duration(elapsed / done * (self.total - self.n))} left"
        if self._figures:
            text += f" | {self._figures}"
        print(text, file=self.stream, flush=True)

    def write(self, message: str) -> None:
        """A message between progress updates (above the live bar, or as its own line)."""
        if self._bar is not None:
            tqdm.write(message, file=self.stream)
        else:
            print(message, file=self.stream, flush=True)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
        elif self.enabled and self.n > self._shown:  # the last stretch, when it ended between two lines
            self._line()
