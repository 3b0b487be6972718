"""benchmarks/watch_rivals.py's scoring on a hand-written corpus: a stop inside the author's window counts, one outside
it does not (but is still a flag), a stop on a healthy log is a false alarm, warnings alone are not; the split keeps
a run's files together and balances the halves; the console converters read the formats rldoctor refuses."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

_PATH = Path(__file__).resolve().parents[2] / "benchmarks" / "watch_rivals.py"
_spec = importlib.util.spec_from_file_location("bench_watch_rivals", _PATH)
rivals = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(rivals)


def _log(log_id, verdict, window=None, half="tune", **extra):
    return {"id": log_id, "verdict": verdict, "window": window, "half": half, **extra}


def _row(log, klguard, rldoctor, counted=False):
    row = {"id": log["id"], "half": log["half"], "verdict": log["verdict"], "klguard": klguard, "rldoctor": rldoctor}
    row["klguard_judged"] = rivals.judge(log, klguard, counted)
    row["rldoctor_judged"] = rivals.judge(log, rldoctor, False)
    return row


def _kg(stop=None, warnings=0):
    return {"read": True, "inputs_found": True, "flag_step": stop, "warnings": warnings}


def _rd(critical=None, warning=()):
    return {"read": True, "inputs_found": True, "flag_step": critical, "warning": list(warning)}


def test_a_stop_inside_the_window_counts_and_one_outside_does_not():
    inside, early = _log("a", "failure", [50, 200]), _log("b", "failure", [50, 200])
    assert rivals.judge(inside, _kg(stop=120), False)["in_window"] is True
    outside = rivals.judge(early, _kg(stop=3), False)
    assert outside["in_window"] is False and outside["flagged"] is True  # flagged, but before the author's window
    assert rivals.judge(inside, _kg(stop=200), False)["in_window"] is True  # the window is inclusive
    assert rivals.judge(inside, _kg(stop=201), False)["in_window"] is False
    assert rivals.judge(inside, _kg(), False) == {"read": True, "inputs_found": True, "flag_step_author_units": None,
                                                   "flagged": False, "in_window": False, "warned": False}
    assert rivals.judge(inside, _kg(warnings=1), False)["warned"] is True  # advice alone: warned, not flagged


def test_an_open_window_runs_to_the_end_and_no_window_counts_only_as_flagged():
    assert rivals.judge(_log("a", "failure", [100, None]), _kg(stop=480), False)["in_window"] is True
    assert rivals.judge(_log("a", "failure", [100, None]), _kg(stop=99), False)["in_window"] is False
    unwindowed = rivals.judge(_log("b", "failure"), _kg(stop=7), False)
    assert unwindowed["flagged"] is True and unwindowed["in_window"] is None


def test_entries_are_converted_to_the_authors_steps():
    log = _log("a", "failure", [1, 300], steps_per_entry=20)
    assert rivals.judge(log, _kg(stop=10), True)["flag_step_author_units"] == 200  # entry 10 of 20-step logging
    assert rivals.judge(log, _kg(stop=16), True)["in_window"] is False  # entry 16 = step 320
    assert rivals.judge(log, _kg(stop=16), False)["in_window"] is True  # a tool that read real steps: step 16


def test_a_healthy_stop_is_a_false_alarm_and_warnings_alone_are_not():
    healthy = _log("h", "healthy")
    assert rivals.judge(healthy, _kg(stop=40), False)["false_alarm"] is True
    calm = rivals.judge(healthy, _kg(warnings=3), False)
    assert calm["false_alarm"] is False and calm["warnings_only"] is True
    assert rivals.judge(healthy, _rd(critical=None, warning=["plateau"]), False)["warnings_only"] is True
    assert rivals.judge(healthy, _rd(critical=200), False)["false_alarm"] is True


def test_score_counts_per_tool_and_half():
    logs = [_log("h1", "healthy"), _log("h2", "healthy", half="heldout"), _log("f1", "failure", [10, 20]),
            _log("f2", "failure", [10, 20], half="heldout"), _log("f3", "failure", None, half="heldout"),
            _log("u", "unlabelled", half="heldout")]
    rows = [_row(logs[0], _kg(stop=5), _rd(warning=["kl_drift"])),
            _row(logs[1], _kg(warnings=2), _rd(critical=40)),
            _row(logs[2], _kg(stop=15), _rd()),
            _row(logs[3], _kg(stop=2), _rd(critical=30)),
            _row(logs[4], _kg(), _rd(critical=9)),
            _row(logs[5], {"read": True, "inputs_found": False, "flag_step": 3, "warnings": 0}, _rd(critical=1))]
    summary = rivals.score(rows)
    kg, rd = summary["klguard"], summary["rldoctor"]
    assert kg["tune"] == {"logs": 2, "read": 2, "inputs_found": 2, "healthy": 1, "false_alarms": 1,
                          "warnings_only_on_healthy": 0, "failures": 1, "failures_with_window": 1,
                          "flagged_in_window": 1, "flagged_at_all": 1, "warned_at_all": 1}
    assert kg["heldout"]["false_alarms"] == 0 and kg["heldout"]["warnings_only_on_healthy"] == 1
    assert (kg["heldout"]["flagged_in_window"], kg["heldout"]["failures_with_window"]) == (0, 1)  # stop at 2 < 10
    assert (kg["heldout"]["flagged_at_all"], kg["heldout"]["failures"]) == (1, 2)
    assert kg["heldout"]["logs"] == 4 and kg["heldout"]["inputs_found"] == 3  # unlabelled: counted, never judged
    assert rd["all"]["false_alarms"] == 1 and rd["all"]["warnings_only_on_healthy"] == 1
    assert rd["all"]["flagged_at_all"] == 2 and rd["all"]["flagged_in_window"] == 0
    table = rivals.table(summary)
    assert "| klguard | tune | 2 | 2 | 2 | 1 of 1 | 0 of 1 | 1 of 1 | 1 of 1 | 1 of 1 |" in table


def test_the_split_keeps_a_run_together_and_balances_the_halves():
    logs = [{"verdict": v, "trainer_family": t, "run_group": g} for v, t, g in [
        ("healthy", "verl", "a"), ("healthy", "verl", "b"), ("healthy", "verl", "c"),
        ("failure", "verl", "d"), ("failure", "verl", "e"), ("failure", "verl", "f"),
        ("failure", "trl", "g"), ("failure", "trl", "g")]]
    halves = rivals.split_halves(logs)
    assert set(halves) == set("abcdefg")
    assert sum(h == "tune" for h in halves.values()) in (3, 4)
    verl_healthy = [halves[g] for g in "abc"]
    verl_failure = [halves[g] for g in "def"]
    assert sorted(verl_healthy).count("tune") + sorted(verl_failure).count("tune") == 3  # odd strata alternate


def test_the_committed_labels_follow_the_split_rule():
    labels = rivals.load_labels()
    halves = rivals.split_halves(labels["logs"])
    assert all(log["half"] == halves[log["run_group"]] for log in labels["logs"])
    ids = [log["id"] for log in labels["logs"]]
    assert len(ids) == len(set(ids))
    for log in labels["logs"]:
        assert log["verdict"] in ("healthy", "failure", "unlabelled")
        assert (log["verdict"] == "failure") == (log["failure_kind"] is not None)
        if log["location"] == "repo":
            data = (rivals.CORPUS / log["file"]).read_bytes()
            assert rivals.sha256_bytes(data) == log["sha256"], log["id"]


def test_extract_keeps_the_header_and_one_runs_rows():
    raw = b"run_name,metric,step,value\na,eval/reward,0,0.1\nb,eval/reward,0,0.2\na,eval/reward,3,0.3\n"
    log = {"source": {"extract": {"csv_rows_where": {"column": "run_name", "equals": "a"}}}}
    assert rivals.extract(log, raw) == b"run_name,metric,step,value\na,eval/reward,0,0.1\na,eval/reward,3,0.3\n"
    assert rivals.extract({"source": {}}, raw) == raw


@pytest.mark.parametrize("converter, text, expected", [
    ("verl-console", "\x1b[36m(main_task pid=1)\x1b[0m step:3 - critic/score/mean:np.float64(0.5)"
     " - actor/kl_loss:0.01\nstep:3 - val-core/x/acc/mean@1:0.7\nnoise\n",
     [{"step": 3, "critic/score/mean": 0.5, "actor/kl_loss": 0.01, "val-core/x/acc/mean@1": 0.7}]),
    ("trl-console", "\r 1/9 [00:01] {'loss': 0.0, 'grad_norm': nan, 'reward': '0.5'}\n{'train_runtime': 3.0}\n"
     "{'eval_loss': 1.0}\n{'loss': 0.1, 'kl': 0.02}\n",
     [{"step": 1, "loss": 0.0, "reward": 0.5}, {"step": 2, "loss": 0.1, "kl": 0.02}]),
    ("kv-lines", "[Step 2/500] loss=-0.32 reward_avg=0.125 avg_response_len=6.6\n"
     "[step 7/200] correct=3/4 rewards=['0.80'] loss=-0.0051 lr=0.00e+00 wasted=0\n",
     [{"step": 2, "loss": -0.32, "reward_avg": 0.125, "avg_response_len": 6.6},
      {"step": 7, "loss": -0.0051, "lr": 0.0, "wasted": 0.0}]),
    ("jsonl-text", '"mean|std"\n{"step": 1, "len": "52.5|37.7"}\n', [{"step": 1, "len": "52.5|37.7"}]),
])
def test_console_converters(converter, text, expected):
    records = rivals.CONVERTERS[converter](text)
    if converter == "trl-console":  # a nan is a number that is not kept equal to itself: drop it before comparing
        assert json.dumps(records[0]["grad_norm"]) == "NaN"
        records[0].pop("grad_norm")
    assert records == expected
