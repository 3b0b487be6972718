"""global_profiler (tool=torch): which steps and ranks write traces, what the files hold, atomic writes."""

from __future__ import annotations

import gzip
import json

import pytest
import torch

from klguard.runtime.profiling import StepProfiler, phase


def _run_steps(profiler: StepProfiler, steps: range) -> None:
    a = torch.randn(64, 64)
    for n in steps:
        with profiler.step(n), phase("update_actor"):
            (a @ a).sum()


def _profiler(tmp_path, steps, *, continuous=False, rank=0, ranks=(0,), contents=()):
    logged: list[str] = []
    prof = StepProfiler(steps=steps, save_path=tmp_path, contents=list(contents), continuous=continuous, rank=rank,
                        ranks=None if ranks is None else list(ranks), device=torch.device("cpu"), log=logged.append)
    return prof, logged


def _trace_names(path) -> list[str]:
    with gzip.open(path, "rt") as f:
        return [event.get("name", "") for event in json.load(f)["traceEvents"]]


def test_each_listed_step_gets_its_own_trace_and_summary(tmp_path):
    prof, logged = _profiler(tmp_path, [2, 3])
    _run_steps(prof, range(1, 5))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["step_2", "step_3"]
    for step in ("step_2", "step_3"):
        names = _trace_names(tmp_path / step / "rank0.pt.trace.json.gz")
        assert names.count("update_actor") == 1  # one step's phase range, labelled
        assert "aten::mm" in names
        summary = (tmp_path / step / "rank0.txt").read_text()
        assert "aten::mm" in summary and "Self CPU" in summary
        assert sorted(p.name for p in (tmp_path / step).iterdir()) == ["rank0.pt.trace.json.gz", "rank0.txt"]
    assert logged == [f"klguard: profiled step {n}: {tmp_path / f'step_{n}' / 'rank0.pt.trace.json.gz'}"
                      for n in (2, 3)]


def test_continuous_steps_share_one_trace(tmp_path):
    prof, _ = _profiler(tmp_path, [2, 3, 5], continuous=True)
    _run_steps(prof, range(1, 7))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["step_2-3", "step_5"]
    assert _trace_names(tmp_path / "step_2-3" / "rank0.pt.trace.json.gz").count("update_actor") == 2
    assert _trace_names(tmp_path / "step_5" / "rank0.pt.trace.json.gz").count("update_actor") == 1


def test_close_writes_a_window_the_run_did_not_finish(tmp_path):
    prof, _ = _profiler(tmp_path, [3, 4], continuous=True)
    _run_steps(prof, range(1, 4))  # the run stops after step 3 (a pause, the last step)
    assert not tmp_path.exists() or not any(tmp_path.iterdir())
    prof.close()
    assert (tmp_path / "step_3" / "rank0.pt.trace.json.gz").is_file()
    prof.close()  # nothing open: no-op


@pytest.mark.parametrize("continuous", [False, True])
def test_a_step_that_raises_still_writes_its_trace(tmp_path, continuous):
    prof, _ = _profiler(tmp_path, [1, 2], continuous=continuous)
    with pytest.raises(RuntimeError), prof.step(1):
        raise RuntimeError("boom")
    assert (tmp_path / "step_1" / "rank0.pt.trace.json.gz").is_file()
    assert prof._active is None  # the profiler stopped: nothing keeps recording after the error


@pytest.mark.parametrize(("rank", "ranks", "writes"), [(0, (0,), True), (1, (0,), False), (1, (0, 1), True),
                                                       (3, None, True)])
def test_only_the_selected_ranks_write(tmp_path, rank, ranks, writes):
    prof, _ = _profiler(tmp_path, [1], rank=rank, ranks=ranks)
    _run_steps(prof, range(1, 2))
    assert (tmp_path / "step_1" / f"rank{rank}.pt.trace.json.gz").is_file() == writes


def test_contents_switch_the_recorded_extras(tmp_path):
    prof, _ = _profiler(tmp_path, [1], contents=["cpu", "shapes", "memory"])
    assert prof.options == {"profile_memory": True, "record_shapes": True, "with_stack": False}
    _run_steps(prof, range(1, 2))
    with gzip.open(tmp_path / "step_1" / "rank0.pt.trace.json.gz", "rt") as f:
        events = json.load(f)["traceEvents"]
    assert any(e.get("name") == "aten::mm" and "Input Dims" in e.get("args", {}) for e in events)
    cuda_only, _ = _profiler(tmp_path, [1], contents=["cuda"])  # on a CPU run: the CPU, not nothing
    assert cuda_only.activities == [torch.profiler.ProfilerActivity.CPU]


def test_nothing_listed_records_nothing(tmp_path):
    prof, _ = _profiler(tmp_path, None)
    assert not prof.enabled
    _run_steps(prof, range(1, 3))
    assert not tmp_path.exists() or not any(tmp_path.iterdir())
