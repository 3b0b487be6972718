"""benchmarks/final_gold.py: a run's last checkpoint re-scored on its own validation split; bad folders refused."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

from klguard.commands.cli import main as klguard

_PATH = Path(__file__).resolve().parents[2] / "benchmarks" / "final_gold.py"
_spec = importlib.util.spec_from_file_location("bench_final_gold", _PATH)
final_gold = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(final_gold)

GOLD = "val-core/klguard/arith/acc/mean@1"


def test_at_the_runs_own_size_it_reproduces_the_final_validation(fast_overrides, tmp_path, one_thread):
    assert klguard(["train", *fast_overrides, "trainer.total_training_steps=2", "trainer.test_freq=-1"]) == 0
    run, out = tmp_path / "run", tmp_path / "gold.json"
    final = json.loads((run / "metrics.jsonl").read_text().splitlines()[-1])
    assert final_gold.main([str(run), "--problems", "16", "--out", str(out)]) == 0
    result = json.loads(out.read_text())
    assert result["problems"] == 16
    # shares of the same 16 problems (exact in float): any difference is >= 1/16
    assert result["final_gold"][str(run)] == pytest.approx(final[GOLD], abs=1e-6)


@pytest.mark.parametrize("argv, message", [
    (["{tmp}/nowhere", "--out", "{tmp}/r.json"], "not a klguard run directory (no config.yaml): "),
    (["{tmp}"], "the following arguments are required: --out"),
])
def test_bad_arguments_end_with_one_line_and_exit_2(tmp_path, capsys, argv, message):
    with pytest.raises(SystemExit) as stop:
        final_gold.main([a.format(tmp=tmp_path) for a in argv])
    assert stop.value.code == 2
    assert message in capsys.readouterr().err.strip().splitlines()[-1]
