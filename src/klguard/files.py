"""Files that are whole or absent: atomic writes, fsync, content hashes, and cached folders that klguard builds once
and reuses (an SFT policy, a learned RM, a converted GGUF file): where the cache is, one build at a time (runs
started together wait for the first one's build instead of repeating it), and publishing a finished build
atomically. Plain file I/O, below every other package, so models and the runtime both use it."""

from __future__ import annotations

import hashlib
import os
import shutil
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

try:
    import fcntl
except ImportError:  # no flock (Windows): builds may repeat; publish() still keeps one complete folder
    fcntl = None


def fsync_tree(root: Path) -> None:
    for path in sorted(root.rglob("*")):
        if path.is_file():
            with open(path, "rb") as fh:
                os.fsync(fh.fileno())
    fsync_dir(root)


def fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


@contextmanager
def atomic_file(path: Path) -> Iterator[Path]:
    """A hidden path next to `path`, with its name's suffixes, to write in the block: renamed onto `path` when the
    block ends, deleted when it raises, so `path` is never a torn file."""
    tmp = path.with_name(f".tmp.{path.name}")
    try:
        yield tmp
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)  # only left when the block or the rename failed


def atomic_write_text(path: Path, text: str) -> None:
    with atomic_file(path) as tmp, open(tmp, "w", encoding="utf-8") as fh:
        fh.write(text)
        fh.flush()
        os.fsync(fh.fileno())


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def cache_root() -> Path:
    """klguard's cache: $KLGUARD_CACHE, else ~/.cache/klguard."""
    return Path(os.environ.get("KLGUARD_CACHE", Path.home() / ".cache" / "klguard"))


def publish(tmp: Path, out: Path, marker: str, *, replace: bool = False) -> None:
    """Rename the finished cache folder `tmp` to `out` (atomic). Builds are deterministic, so when another process
    published a complete `out` first, its folder is kept and `tmp` dropped; an incomplete `out` (a crash mid-copy)
    is replaced, a complete one only when `replace` (a forced rebuild)."""
    if out.exists() and (replace or not (out / marker).is_file()):
        shutil.rmtree(out, ignore_errors=True)
    try:
        os.replace(tmp, out)
    except OSError:
        if not (out / marker).is_file():
            raise
        shutil.rmtree(tmp, ignore_errors=True)


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
