"""Runs started together build a cached folder once: the second waits for the first, then finds the folder."""

from __future__ import annotations

import threading
import time

from klguard.files import build_lock, publish


def _ensure(out, builds: list[str], log: list[str], name: str) -> None:
    """The shape of ensure_learned_rm / ensure_sft_policy: a cache check, then the build under the lock."""
    if (out / "done").is_file():
        return
    with build_lock(out, "a test folder", log.append):
        if (out / "done").is_file():
            return
        builds.append(name)
        time.sleep(0.3)  # the build: long enough for the other thread to arrive and wait
        out.mkdir()
        (out / "done").write_text("1")


def test_two_builds_started_together_build_once(tmp_path):
    out, builds, log = tmp_path / "cache" / "rm-abc", [], []
    threads = [threading.Thread(target=_ensure, args=(out, builds, log, f"t{i}")) for i in range(2)]
    threads[0].start()
    time.sleep(0.05)
    threads[1].start()
    for thread in threads:
        thread.join()
    assert len(builds) == 1 and (out / "done").is_file()
    assert log[0] == f"klguard: waiting for another process building a test folder at {out}"
    assert log[1].startswith("klguard: waited ") and log[1].endswith(" s for a test folder")


def test_a_build_that_fails_frees_the_lock(tmp_path):
    out = tmp_path / "rm-x"
    try:
        with build_lock(out, "x", print):
            raise RuntimeError("killed mid-build")
    except RuntimeError:
        pass
    log: list[str] = []
    with build_lock(out, "x", log.append):
        pass
    assert log == []  # nobody held it: no wait


def test_cache_publish_keeps_a_folder_another_process_finished_first(tmp_path):
    """Two runs of `klguard demo` build the tokenizer cache at once: the second rename keeps the first's folder."""
    out = tmp_path / "cache"
    out.mkdir()
    (out / "done").write_text("first")
    tmp = tmp_path / "cache.partial-2"
    tmp.mkdir()
    (tmp / "done").write_text("second")
    publish(tmp, out, "done")  # the other process won: its complete folder stays, ours goes
    assert (out / "done").read_text() == "first" and not tmp.exists()
    tmp.mkdir()
    (tmp / "done").write_text("forced")
    publish(tmp, out, "done", replace=True)  # sft --force rebuilds on purpose
    assert (out / "done").read_text() == "forced" and not tmp.exists()
    (out / "done").unlink()  # a half-written folder left by a crash is replaced
    tmp.mkdir()
    (tmp / "done").write_text("fresh")
    publish(tmp, out, "done")
    assert (out / "done").read_text() == "fresh"
