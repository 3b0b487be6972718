"""A guard restored mid-run acts like an uninterrupted one; invariants on arbitrary streams."""

from __future__ import annotations

import itertools
import json
import math
from pathlib import Path

from guard_streams import QUIET, Driver, make, seed_config, steps
from hypothesis import given, settings
from hypothesis import strategies as st

from klguard.guard import ACTION_KINDS, KLGuard

VAL = "val-core/arith/acc/mean@1"
COOLDOWN_RULES = ("penalty_share", "kl_spike", "kl_slow", "hacking")


def busy_stream(n: int = 80) -> list[tuple[int, dict[str, float]]]:
    """A run that drifts, spikes, hacks and loses validation score: most rules fire somewhere."""
    over: dict[int, dict[str, float]] = {}
    for s in range(1, n + 1):
        kl = 0.01 + 0.0004 * s + (0.04 if s in (30, 31) else 0.0)
        over[s] = {"actor/reward_kl_penalty": kl, "actor/kl_seq_sum": 0.5 + 0.05 * s,
                   "response_length/mean": 10.0 + (0.3 * (s - 40) if s > 40 else 0.0),
                   "actor/entropy": 1.0 - 0.01 * s, "actor/ppo_kl": 0.03 if s % 17 in (0, 1, 2) else 0.01,
                   "actor/grad_norm": 20.0 if s == 25 else 2.0, "actor/grad_clip": 0.0,
                   "hacking/length_reward_corr": 0.7}
        if s % 10 == 0:
            over[s][VAL] = 0.6 - 0.004 * max(0, s - 40)
    return steps(over, n)


def replay(split: int, stream: list[tuple[int, dict[str, float]]], **cfg: object) -> tuple[list, list]:
    """Actions and metrics of an uninterrupted guard, and of one saved and restored after ``split``."""
    whole = make(**cfg)
    whole.run(stream)
    first = make(**cfg)
    first.run(stream[:split])
    state = json.loads(json.dumps(first.guard.state_dict(), allow_nan=False))  # strict JSON
    resumed = Driver(KLGuard(seed_config(**cfg), total_steps=100, target_kl=0.5, kl_coef=7.0), beta=first.beta)
    resumed.guard.load_state_dict(state)
    resumed.log, resumed.metrics = dict(first.log), dict(first.metrics)
    resumed.run(stream[split:])
    return ([whole.log, whole.metrics], [resumed.log, resumed.metrics])


def test_busy_stream_exercises_the_rules() -> None:
    d = make()
    d.run(busy_stream())
    kinds = {a.kind for acts in d.log.values() for a in acts}
    assert kinds >= {"warn", "cut_lr", "raise_kl_coef", "lower_target_kl", "set_grad_clip", "rollback"}


def test_restored_guard_matches_uninterrupted_run() -> None:
    stream = busy_stream()
    for split in (1, 17, 30, 41, 55, 79):
        whole, resumed = replay(split, stream)
        assert resumed == whole, split


def test_restored_guard_matches_with_warmup() -> None:
    stream = busy_stream(40)
    for split in (5, 20, 21):
        whole, resumed = replay(split, stream, warmup_kl_coef=0.0)
        assert resumed == whole, split


def test_state_rejects_unknown_keys_and_versions() -> None:
    guard = make().guard
    state = guard.state_dict()
    for bad in ({**state, "bogus": 1}, {**state, "version": 99}):
        try:
            guard.load_state_dict(bad)
        except ValueError:
            continue
        raise AssertionError("accepted a bad state")


def test_disabled_guard_does_nothing() -> None:
    d = make(enable=False, warmup_kl_coef=0.0)
    d.run(busy_stream(40))
    assert d.fired() == {} and d.guard.guard_metrics() == {}
    assert d.guard.is_stable() and not d.guard.in_warmup(1)


# ------------------------------------------------------------------ invariants on arbitrary streams

_VALUE = {
    "actor/ppo_kl": st.floats(0.0, 0.06),
    "actor/reward_kl_penalty": st.floats(-0.01, 0.08),
    "actor/kl_seq_sum": st.floats(0.0, 5.0),
    "critic/score/mean": st.floats(-2.0, 2.0),
    "actor/grad_norm": st.floats(0.0, 30.0),
    "response_length/mean": st.floats(1.0, 40.0),
    "actor/entropy": st.floats(0.0, 2.0),
    "hacking/length_reward_corr": st.floats(-1.0, 1.0),
    VAL: st.one_of(st.none(), st.floats(0.0, 1.0)),
}


def _stream_strategy() -> st.SearchStrategy:
    step = st.fixed_dictionaries(_VALUE).map(lambda m: {**QUIET, **{k: v for k, v in m.items() if v is not None}})
    return st.lists(step, min_size=1, max_size=60)


@settings(max_examples=40, deadline=None)
@given(_stream_strategy(), st.integers(0, 60), st.sampled_from(["raise_kl_coef", "rollback", "none"]))
def test_invariants_and_resume_on_random_streams(metrics: list[dict[str, float]], split: int, hacking: str) -> None:
    stream = list(enumerate(metrics, start=1))
    d = make(hacking_action=hacking, warmup_kl_coef=0.05)
    d.run(stream)
    actions = [a for acts in d.log.values() for a in acts]
    assert all(a.kind in ACTION_KINDS for a in actions)
    json.dumps([a.to_dict() for a in actions], allow_nan=False)
    # The guard only tightens (outside the warm-up release), and never oscillates
    for a in actions:
        if a.kind in ("raise_kl_coef", "cut_lr", "lower_target_kl"):
            assert (a.new > a.old) if a.kind == "raise_kl_coef" else (a.new < a.old)
    targets = [m["guard/target_kl"] for m in d.metrics.values()]
    assert all(b <= a for a, b in itertools.pairwise(targets))
    assert all(0.05 <= m["guard/lr_scale"] <= 1.0 for m in d.metrics.values())
    for rule in COOLDOWN_RULES:  # cooldown between two firings of one rule
        fired = sorted({a.step for a in actions if a.rule == rule})
        assert all(b - a >= 10 for a, b in itertools.pairwise(fired)), (rule, fired)
    assert sum(a.kind == "rollback" for a in actions) <= 3
    assert all(math.isfinite(v) for m in d.metrics.values() for v in m.values())
    whole, resumed = replay(min(split, len(stream)), stream, hacking_action=hacking, warmup_kl_coef=0.05)
    assert resumed == whole


# ------------------------------------------------------------------ a version 1 state (each rule's memory in a field)

def v1_stream(n: int = 80) -> list[tuple[int, dict[str, float]]]:
    """busy_stream with every hacking signal's metric, so every rule and baseline has a memory to carry over."""
    return [(s, {**metrics, "hacking/repeated_ngram_share": 0.1 + 0.004 * s, "hacking/rm_ensemble_std": 0.2 + 0.01 * s,
                 "hacking/ref_low_prob_share": 0.02 + 0.001 * s, "hacking/ref_nll": 1.2 + 0.01 * s,
                 "hacking/rm_feature_outlier_share": 0.03 + 0.001 * s, "hacking/rm_score": 0.5 + 0.05 * s,
                 "hacking/rm_score_std": 1.0, "hacking/audit_score": 0.5, "hacking/audit_score_std": 1.0})
            for s, metrics in busy_stream(n)]


def test_a_version_1_state_resumes_with_the_same_decisions() -> None:
    """guard_state_v1.json: a state the guard wrote before its rules were declared one a file, and what that guard
    decided and logged after it; this guard, loading it, decides and logs the same."""
    fixture = json.loads((Path(__file__).parent / "guard_state_v1.json").read_text())
    assert fixture["state"]["version"] == 1 and "ppo_kl_streak" in fixture["state"]
    split = fixture["split"]
    resumed = Driver(KLGuard(seed_config(**fixture["config"]), total_steps=100, target_kl=0.015, kl_coef=0.1),
                     beta=fixture["beta"])
    resumed.guard.load_state_dict(fixture["state"])
    resumed.run(v1_stream()[split:])
    actions = {str(s): [a.to_dict() for a in acts] for s, acts in resumed.log.items() if acts}
    assert actions == {s: acts for s, acts in fixture["actions"].items() if acts} != {}
    assert {str(s): m for s, m in resumed.metrics.items()} == fixture["metrics"]
    assert resumed.guard.state_dict()["version"] == 2
