"""benchmarks/trl_guard.py's timer wraps methods the TRL callback and host really have (the benchmark is not run)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

from klguard.integrations.trl import KLGuardCallback
from klguard.integrations.trl.callback import TRLHost

_PATH = Path(__file__).resolve().parents[2] / "benchmarks" / "trl_guard.py"
_spec = importlib.util.spec_from_file_location("bench_trl_guard", _PATH)
trl_guard = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(trl_guard)


def test_install_wraps_every_hook_and_every_weight_load(monkeypatch):
    targets = [(KLGuardCallback, n) for n in trl_guard.HOOKS] + [(TRLHost, n) for n in trl_guard.ROLLBACK]
    originals = {}
    for cls, name in targets:
        originals[cls, name] = getattr(cls, name)  # raises where the callback or host renamed a method
        monkeypatch.setattr(cls, name, originals[cls, name])  # undone after the test
    trl_guard.HookTimer().install()
    for cls, name in targets:
        assert getattr(cls, name).__wrapped__ is originals[cls, name]


def test_time_spent_in_a_wrapped_call_lands_in_its_bucket():
    timer = trl_guard.HookTimer()
    timed = timer._timed(lambda: sum(range(10_000)), "rollbacks")
    assert timed() == sum(range(10_000))
    assert timer.rollbacks > 0 and timer.total == 0
