"""One build of a cached folder at a time: runs started together wait for the first one's build instead of repeating
it (a learned RM's fit, an SFT policy), then find its folder in the cache."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

try:
    import fcntl
except ImportError:  # no flock (Windows): builds may repeat; publish() still keeps one complete folder
    fcntl = None


@contextmanager
def build_lock(out: Path, what: str, log: Callable[[str], None] = print) -> Iterator[None]:
    """Hold an exclusive lock on `out`'s sibling `<name>.lock` while building `out`; a second process (or thread)
    blocks here, saying once that it waits and, when it may go on, for how long it waited. The lock goes with the
    process: a build killed mid-way frees it."""
    if fcntl is None:
        yield
        return
    out.parent.mkdir(parents=True, exist_ok=True)
    with open(out.with_name(out.name + ".lock"), "a+") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            log(f"klguard: waiting for another process building {what} at {out}")
            started = time.monotonic()
            fcntl.flock(handle, fcntl.LOCK_EX)
            log(f"klguard: waited {time.monotonic() - started:.0f} s for {what}")
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)
