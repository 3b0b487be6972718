"""benchmarks/hacking.py's per-cell targets on hand-made means: the guarded default against the best fixed beta,
and the guard with no gold against both."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

_PATH = Path(__file__).resolve().parents[2] / "benchmarks" / "hacking.py"
_spec = importlib.util.spec_from_file_location("bench_hacking", _PATH)
hacking = importlib.util.module_from_spec(_spec)
sys.modules[_spec.name] = hacking
_spec.loader.exec_module(hacking)


def _means(guarded: float, no_gold: float | None) -> dict:
    means = {"guarded": {"final_gold": guarded, "hacking_rate": 0.08},
             "verl_default": {"final_gold": 0.1, "hacking_rate": 0.9},
             "fixed_0.3": {"final_gold": 0.70, "hacking_rate": 0.2}, "fixed_1.0": {"final_gold": 0.80,
                                                                               "hacking_rate": 0.1}}
    if no_gold is not None:
        means["guarded_no_gold"] = {"final_gold": no_gold, "hacking_rate": 0.1}
    return means


RUNS = {"guarded": [{"first_hacking_rate": 0.07, "paused_at": None}, {"first_hacking_rate": 0.09, "paused_at": 120}]}


def test_the_oracle_is_the_best_fixed_beta_and_the_guarded_default_is_held_to_it():
    t = hacking._targets(_means(0.795, None), RUNS)
    assert t["oracle"] == "fixed_1.0" and t["oracle_final_gold"] == 0.80
    assert t["gold_within_0.01"] is True
    assert t["guarded_paused"] == 1 and t["guarded_runs"] == 2
    assert abs(t["hacking_bound"] - 0.10) < 1e-9  # max(0.05, mean first-step rate 0.08 + 0.02)
    assert t["hacking_within_bound"] is True and t["hacking_at_most_0.1x_verl"] is True
    assert "no_gold_final_gold" not in t  # no no-gold runs in this cell
    assert hacking._targets(_means(0.78, None), RUNS)["gold_within_0.01"] is False


def test_the_guard_without_gold_is_held_to_the_oracle_minus_0_02_and_to_the_guard_with_gold():
    ok = hacking._targets(_means(0.80, 0.785), RUNS)
    assert ok["no_gold_final_gold"] == 0.785
    assert ok["no_gold_within_0.02_of_oracle"] is True and ok["no_gold_within_0.02_of_guarded"] is True
    low = hacking._targets(_means(0.80, 0.77), RUNS)
    assert low["no_gold_within_0.02_of_oracle"] is False and low["no_gold_within_0.02_of_guarded"] is False
    # better than the guard with gold by more than 0.02: above the oracle, but not "within 0.02" of the guarded run
    high = hacking._targets(_means(0.70, 0.80), RUNS)
    assert high["no_gold_within_0.02_of_oracle"] is True and high["no_gold_within_0.02_of_guarded"] is False


def test_the_paired_gaps_are_taken_seed_by_seed_over_the_seeds_both_contenders_ran():
    runs = {"guarded": [{"seed": 1, "final_gold": 0.9}, {"seed": 2, "final_gold": 0.8}, {"seed": 3, "final_gold": 0.7}],
            "guarded_no_gold": [{"seed": 1, "final_gold": 0.86}, {"seed": 2, "final_gold": 0.84}],
            "fixed_1.0": [{"seed": 1, "final_gold": 0.92}, {"seed": 2, "final_gold": 0.81}]}
    paired = hacking._targets(_means(0.85, 0.85), runs)["paired"]
    gap = paired["guarded - oracle"]  # seed 3 has no oracle run: two pairs, -0.02 and -0.01
    assert gap["seeds"] == 2 and abs(gap["mean"] + 0.015) < 1e-9
    assert abs(gap["se"] - 0.005) < 1e-9  # stdev(-0.02, -0.01) / sqrt(2)
    assert abs(paired["no_gold - guarded"]["mean"] - 0.0) < 1e-9  # -0.04 and +0.04
    assert abs(paired["no_gold - oracle"]["mean"] - (-0.015)) < 1e-9


def test_a_cell_with_one_paired_seed_has_no_standard_error_and_a_cell_without_seeds_has_no_pairs():
    runs = {"guarded": [{"seed": 1, "final_gold": 0.9}], "fixed_1.0": [{"seed": 1, "final_gold": 0.8}]}
    one = hacking._targets(_means(0.9, None), runs)["paired"]
    assert one["guarded - oracle"]["seeds"] == 1 and one["guarded - oracle"]["se"] is None
    assert "no_gold - oracle" not in one
    assert hacking._targets(_means(0.9, None), RUNS)["paired"] == {}


def test_the_sft_policys_own_rate_comes_from_the_file_named_and_only_for_the_length_exploit(tmp_path):
    rates = tmp_path / "sft_hacking.json"
    rates.write_text('{"prompts": 8, "results": {"sft1": {"sampled": {"hacking_rate": 0.125}}}}')
    assert hacking._sft_rate("length/sft1", rates) == 0.125
    assert hacking._sft_rate("length/sft2", rates) is None  # not measured there: step 1's rollouts stand in
    assert hacking._sft_rate("learned_rm/sft1", rates) is None
    assert hacking._sft_rate("length/sft1", tmp_path / "missing.json") is None


def _run(gold: float, wide: float | None, problems: int | None = 2048) -> dict:
    figures = {"final_gold": gold, "hacking_rate": 0.05, "first_hacking_rate": 0.05, "paused_at": None}
    if wide is not None:
        figures |= {"final_gold_rescored": wide, "rescored_problems": problems}
    return figures


def test_the_targets_read_the_rescored_gold_only_where_every_run_has_it_at_one_size(tmp_path):
    # on 256 problems the guard is 0.02 above fixed 1.0; on 2048 it is 0.02 under: the wide figure decides
    runs = {"length/sft0/guarded_s1": _run(0.82, 0.78), "length/sft0/fixed_1.0_s1": _run(0.80, 0.80)}
    result = hacking._merge(tmp_path / "none.json", runs, [], tmp_path / "no_rates.json")
    assert (result["gold"], result["gold_problems"]) == ("final_gold_rescored", 2048)
    t = result["targets"]["length/sft0"]
    assert t["guarded_final_gold"] == 0.78 and t["gold_within_0.01"] is False
    assert abs(t["paired"]["guarded - oracle"]["mean"] + 0.02) < 1e-9
    assert result["means"]["length/sft0"]["guarded"]["final_gold"] == 0.82  # the run's own validation stays
    for other in (_run(0.80, None), _run(0.80, 0.80, problems=512)):  # one run not re-scored, or at another size
        mixed = hacking._merge(tmp_path / "none.json", {**runs, "length/sft0/fixed_1.0_s1": other}, [],
                               tmp_path / "no_rates.json")
        assert mixed["gold"] == "final_gold" and mixed["targets"]["length/sft0"]["gold_within_0.01"] is True


def test_a_runs_rescored_gold_is_scored_once_and_kept_in_its_directory(tmp_path, monkeypatch):
    calls = []
    monkeypatch.setattr(hacking, "final_gold", lambda run_dir, problems: calls.append(problems) or 0.5)
    assert hacking._rescored(tmp_path, 64) == 0.5 and hacking._rescored(tmp_path, 64) == 0.5
    assert calls == [64] and (tmp_path / "final_gold_64.json").is_file()
    assert hacking._rescored(tmp_path, 128) == 0.5 and calls == [64, 128]  # another size is scored anew
