"""SIGTERM/SIGINT during training: finish the current step, write a checkpoint, exit 0.

The first signal only sets a flag that the training loop reads between steps; a second one exits
at once with 128 + the signal number (130 for SIGINT, 143 for SIGTERM). Exiting at once corrupts
nothing: a checkpoint folder appears only by rename once whole (klguard.runtime.checkpoint), and a resume
drops log lines written after the checkpoint it resumes from.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
from types import FrameType

SIGNALS = (signal.SIGTERM, signal.SIGINT)


class Preemption:
    """Context manager that installs the handlers (main thread only) and restores the old ones."""

    def __init__(self) -> None:
        self.signal_name: str | None = None
        self._previous: dict[int, object] = {}

    @property
    def requested(self) -> bool:
        return self.signal_name is not None

    def __enter__(self) -> Preemption:
        if threading.current_thread() is threading.main_thread():
            for sig in SIGNALS:
                self._previous[sig] = signal.signal(sig, self._handle)
        return self

    def __exit__(self, *exc) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
        self._previous.clear()

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        name = signal.Signals(signum).name
        if self.requested:
            sys.stderr.write(f"klguard: second {name}: exiting now, without a checkpoint of this step\n")
            sys.stderr.flush()
            os._exit(128 + signum)
        self.signal_name = name
        sys.stderr.write(f"klguard: {name} received: finishing this step and writing a checkpoint "
                         "(send it again to exit at once)\n")
        sys.stderr.flush()
