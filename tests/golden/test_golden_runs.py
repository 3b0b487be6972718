"""The golden runs reproduce their committed `metrics.jsonl` and `events.jsonl` bit for bit (every key but
`timing_s/*` and `perf/*`): a refactoring that changes a number fails here. See golden_runs.py."""

from __future__ import annotations

import json

import pytest
from golden_runs import RUNS, VERSIONS_FILE, golden_files, records, train, versions

pytestmark = pytest.mark.slow


def test_golden_files_match_the_installed_libraries():
    """Other torch or transformers releases may round differently: regenerate the goldens in their own commit."""
    assert json.loads(VERSIONS_FILE.read_text()) == versions(), "run python tests/golden/golden_runs.py"


@pytest.fixture(scope="module")
def golden_sft_cache(tmp_path_factory):
    """The golden runs' own SFT cache: a policy the other tests trained outside the reproducible environment rounds
    differently. The first golden run trains it, the second reuses it (both runs' SFT settings are the same)."""
    return tmp_path_factory.mktemp("golden-sft")


@pytest.mark.parametrize("name", list(RUNS))
def test_golden_run_is_bit_identical(name, tmp_path, golden_sft_cache):
    run_dir = train(name, tmp_path / "run", golden_sft_cache)
    for kind, golden in golden_files(name).items():
        expected, got = records(golden), records(run_dir / f"{kind}.jsonl")
        assert len(got) == len(expected), f"{kind}: {len(got)} lines, golden has {len(expected)}"
        for want, have in zip(expected, got, strict=True):
            keys = sorted(set(want) | set(have))
            changed = {k: (want.get(k), have.get(k)) for k in keys if want.get(k) != have.get(k)}
            assert not changed, f"{kind} step {want.get('step')}: {changed}"
