"""The step gate shared by the throughput benchmark's workers (klguard's interpreter and TRL's venv).

A worker builds its trainer, calls ``Gate.ready()`` and then ``Gate.step_done(...)`` after every
training step. Each call writes one JSON line to the worker's original stdout (library prints are
moved to stderr) and blocks until the driver (benchmarks/throughput.py) answers ``go`` (run the
next step; its clock starts now) or ``stop`` (write the peak memory and exit). The driver releases
the contenders of a pairing in turn, A B A B ..., so both see the same machine load. Only the
standard library is used: TRL's venv does not have klguard installed.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import resource
import sys
import time


def peak_rss_mib() -> float:
    """This process's peak resident set size (Linux reports ru_maxrss in KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def release_free_memory() -> None:
    """Hand the heap's free pages back to the system (glibc's malloc_trim; nothing elsewhere). Called between
    steps, outside the timed window, so two large contenders side by side need memory for one step's peak, not two."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6").malloc_trim(0)


class Gate:
    def __init__(self) -> None:
        self._out = os.fdopen(os.dup(sys.stdout.fileno()), "w", buffering=1)
        sys.stdout.flush()
        os.dup2(sys.stderr.fileno(), sys.stdout.fileno())  # stray prints must not corrupt the protocol
        self.released, self.cpu_released = time.perf_counter(), time.process_time()
        self.step = 0

    def _send(self, **message: object) -> None:
        self._out.write(json.dumps(message) + "\n")

    def _wait(self) -> None:
        release_free_memory()  # while the other contender runs: a waiting worker should not hold its step's peak
        command = sys.stdin.readline().strip()
        if command != "go":  # "stop", or the driver went away
            self._send(event="final", peak_rss_mib=peak_rss_mib())
            self._out.close()
            os._exit(0)  # skip the trainers' end-of-run work (final validation, checkpoints)
        self.released, self.cpu_released = time.perf_counter(), time.process_time()

    def ready(self, **info: object) -> None:
        self._send(event="ready", **info)
        self._wait()

    def step_done(self, phases: dict[str, float], exclude_s: float = 0.0, **extra: object) -> None:
        """Report the step that just ended (wall time since its release, less `exclude_s` of measuring
        work that is not the trainer's) and wait for the next command."""
        self.step += 1
        wall = time.perf_counter() - self.released - exclude_s
        cpu = time.process_time() - self.cpu_released - exclude_s  # all threads of this process
        self._send(event="step", step=self.step, wall_s=wall, cpu_s=cpu, phases=phases, rss_mib=peak_rss_mib(),
                   **extra)
        self._wait()


def read_spec() -> dict:
    """The worker's settings: one JSON object as the only command-line argument."""
    return json.loads(sys.argv[1])
