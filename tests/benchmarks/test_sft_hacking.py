"""benchmarks/sft_hacking.py --policies: any policy folder measured by the SFT policies' rule, bad folders refused."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest

from klguard.builtin.trl_task import builtin_policy

_PATH = Path(__file__).resolve().parents[2] / "benchmarks" / "sft_hacking.py"
_spec = importlib.util.spec_from_file_location("bench_sft_hacking", _PATH)
sft_hacking = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(sft_hacking)


def _main(monkeypatch, *argv: str) -> None:
    monkeypatch.setattr(sys, "argv", ["sft_hacking.py", *argv])
    sft_hacking.main()


def test_a_policy_folder_is_measured_and_keyed_by_its_path(monkeypatch, tmp_path):
    out, policy = tmp_path / "rates.json", builtin_policy()
    _main(monkeypatch, "--policies", str(policy), "--prompts", "16", "--out", str(out))
    result = json.loads(out.read_text())
    figures = result["results"][str(policy)]
    assert result["prompts"] == 16 and set(figures) == {"greedy", "sampled"}
    for mode in figures.values():
        assert 0 <= mode["hacking_rate"] <= 1 and 0 <= mode["gold"] <= 1
    assert figures["greedy"]["gold"] > 0.25  # the shipped SFT policy answers most problems right when greedy


@pytest.mark.parametrize("argv, message", [
    (["--policies", "{tmp}/nowhere", "--out", "{tmp}/r.json"], "not a policy folder (no config.json): "),
    (["--policies", "{tmp}"], "--policies needs --out"),
])
def test_bad_policy_arguments_end_with_one_line_and_exit_2(monkeypatch, tmp_path, capsys, argv, message):
    with pytest.raises(SystemExit) as stop:
        _main(monkeypatch, *[a.format(tmp=tmp_path) for a in argv])
    assert stop.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert message in err[-1]
