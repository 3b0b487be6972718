"""The golden runs reproduce their committed `metrics.jsonl` and `events.jsonl`: every guard decision and every
counted metric exactly, the other metrics within float32 rounding (every key but `timing_s/*` and `perf/*`), so a
refactoring that changes a number fails here on any x86 CPU. See golden_runs.py and golden_compare.py."""

from __future__ import annotations

import json

import pytest
from golden_compare import event_differences, metric_differences, policy_terms
from golden_runs import ROLLOUTS, RUNS, VERSIONS_FILE, golden_files, records, train, versions

pytestmark = pytest.mark.slow


def test_golden_files_match_the_installed_libraries():
    """Other torch or transformers releases may compute differently: regenerate the goldens in their own commit
    (README's test command installs the versions of constraints-test.txt)."""
    assert json.loads(VERSIONS_FILE.read_text()) == versions(), "run python tests/golden/golden_runs.py"


@pytest.fixture(scope="module")
def golden_sft_cache(tmp_path_factory):
    """The golden runs' own SFT cache: a policy the other tests trained with more threads rounds differently. The
    first golden run trains it, the second reuses it (both runs' SFT settings are the same)."""
    return tmp_path_factory.mktemp("golden-sft")


@pytest.mark.parametrize("name", list(RUNS))
def test_golden_run_matches(name, tmp_path, golden_sft_cache):
    run_dir = train(name, tmp_path / "run", golden_sft_cache)
    golden = golden_files(name)
    want_metrics, terms = records(golden["metrics"]), policy_terms(run_dir)
    problems = metric_differences(want_metrics, records(run_dir / "metrics.jsonl"), ROLLOUTS[name], terms)
    problems += event_differences(records(golden["events"]), records(run_dir / "events.jsonl"), want_metrics,
                                  ROLLOUTS[name], terms)
    assert not problems, "\n".join(problems[:20])
