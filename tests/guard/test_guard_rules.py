"""Each guard rule fires exactly on the step it should (not one earlier), with the right fields."""

from __future__ import annotations

import pytest
from guard_streams import QUIET, Driver, make, seed_config, steps

from klguard.guard import KLGuard

HOT_PPO = {"actor/ppo_kl": 0.03}


# ------------------------------------------------------------------ rule 1: actor/ppo_kl


def test_ppo_kl_warns_cuts_lr_then_pauses_after_patience() -> None:
    d = make()
    d.run(steps({s: HOT_PPO for s in range(3, 14)}, 14))
    assert d.fired() == {3: ["warn", "cut_lr"], 7: ["pause"], 12: ["pause"]}  # streak 1, 5, 10
    cut = d.log[3][1]
    assert (cut.metric, cut.value, cut.threshold, cut.old, cut.new) == ("actor/ppo_kl", 0.03, 0.025, 1.0, 0.5)
    assert "(lr 0.0001 -> 5e-05)" in cut.reason
    assert d.metrics[3]["guard/lr_scale"] == 0.5 and d.metrics[3]["guard/alarm_ppo_kl"] == 1.0


def test_ppo_kl_at_the_max_is_quiet_and_a_dip_resets_the_streak() -> None:
    d = make()
    hot = {s: HOT_PPO for s in (1, 2, 3, 4, 6, 7, 8, 9)} | {10: {"actor/ppo_kl": 0.025}}
    d.run(steps(hot, 12))
    assert d.fired() == {1: ["warn", "cut_lr"], 6: ["warn"]}  # no pause: streaks of 4; step 6 within cooldown


def test_ppo_kl_absent_neither_extends_nor_breaks_the_streak() -> None:
    d = make()
    stream = steps({s: HOT_PPO for s in range(1, 9)}, 8)
    for s in (3, 4, 5):
        del stream[s - 1][1]["actor/ppo_kl"]
    d.run(stream)
    assert d.fired() == {1: ["warn", "cut_lr"], 8: ["pause"]}  # hot steps 1, 2, 6, 7, 8


def test_lr_cuts_respect_cooldown_and_floor() -> None:
    d = make(cooldown=2, patience=100)
    d.run(steps({s: HOT_PPO for s in range(1, 20, 2)}, 20))  # a new excursion every other step
    cuts = [(a.step, a.new) for acts in d.log.values() for a in acts if a.kind == "cut_lr"]
    assert cuts == [(1, 0.5), (3, 0.25)]  # then at the floor, a quarter of the lr (no ratchet)
    assert sum(d.kinds(s).count("warn") for s in d.log) == 10


# ------------------------------------------------------------------ rule 2: penalty share


def test_penalty_share_raises_kl_coef_with_cooldown() -> None:
    d = make()
    # share = beta * kl_seq_sum / |score| = 0.1 * 2.0 / 1.0 = 0.2: at the max, quiet
    over = {1: {"actor/kl_seq_sum": 2.0}} | {s: {"actor/kl_seq_sum": 2.5} for s in range(2, 30)}
    d.run(steps(over, 25))
    assert [s for s in d.log if "raise_kl_coef" in d.kinds(s)] == [2, 12, 22]
    first = d.log[2][0]
    assert (first.rule, first.metric, first.threshold, first.old, first.new) == (
        "penalty_share", "actor/kl_seq_sum", 0.2, 0.1, pytest.approx(0.15))
    assert first.value == pytest.approx(0.25)
    assert d.log[12][0].old == pytest.approx(0.15) and d.log[12][0].new == pytest.approx(0.225)
    assert d.metrics[2]["guard/penalty_share"] == pytest.approx(0.25)


@pytest.mark.parametrize(("score", "fires"), [(-1.0, True), (0.0, False), (10.0, False)])
def test_penalty_share_uses_absolute_score(score: float, fires: bool) -> None:
    d = make()
    d.run(steps({1: {"actor/kl_seq_sum": 2.5, "critic/score/mean": score}}, 1))
    assert ("raise_kl_coef" in d.kinds(1)) is fires


@pytest.mark.parametrize(("low", "high", "fires"), [(-0.5, 2.0, False), (0.0, 2.0, True), (-3.0, -0.1, True)])
def test_penalty_share_needs_scores_of_one_sign(low: float, high: float, fires: bool) -> None:
    # a reward model's logits straddle 0: |mean score| is then no scale, and the share is undefined (no raise)
    d = make()
    d.run(steps({1: {"actor/kl_seq_sum": 2.5, "critic/score/mean": 0.5 if high > 0 else -1.0,
                     "critic/score/min": low, "critic/score/max": high}}, 1))
    assert ("raise_kl_coef" in d.kinds(1)) is fires
    assert ("guard/penalty_share" in d.metrics[1]) is fires


def test_a_raise_that_would_reach_the_cap_pauses_instead() -> None:
    d = make(kl_coef_max=0.2, cooldown=1)
    d.run(steps({s: {"actor/kl_seq_sum": 5.0} for s in range(1, 6)}, 5))
    news = [a.new for acts in d.log.values() for a in acts if a.kind == "raise_kl_coef"]
    assert news == [pytest.approx(0.15)]  # 0.15 x 1.5 = 0.225 would pass the cap 0.2
    pause = next(a for acts in d.log.values() for a in acts if a.kind == "pause")
    assert pause.rule == "kl_coef_cap" and "would reach its cap guard.kl_coef_max=0.2 (penalty_share)" in pause.reason
    assert d.guard.kl_coef == pytest.approx(0.15)


# ------------------------------------------------------------------ rule 3: grad norm


@pytest.mark.parametrize(("clip", "expected_old"), [(0.0, 0.0), (-1.0, -1.0), (5.0, 5.0), (None, None)])
def test_grad_norm_turns_clipping_on(clip: float | None, expected_old: float | None) -> None:
    d = make()
    base = {k: v for k, v in QUIET.items() if k != "actor/grad_clip"}
    reported = {} if clip is None else {"actor/grad_clip": clip}  # None: the trainer does not report it
    d.run([(1, {**base, **reported, "actor/grad_norm": 10.0}),  # at the max: quiet
           (2, {**base, **reported, "actor/grad_norm": 12.0}),
           (3, {**base, "actor/grad_norm": 50.0})])  # still alarming, but the guard set the clip to 1.0
    assert d.fired() == {2: ["set_grad_clip"]}
    action = d.log[2][0]
    assert (action.old, action.new, action.value, action.threshold) == (expected_old, 1.0, 12.0, 10.0)
    assert d.metrics[3]["guard/alarm_grad_norm"] == 1.0 and d.metrics[3]["guard/grad_clip"] == 1.0


def test_grad_norm_with_tight_clip_does_nothing() -> None:
    d = make()
    d.run(steps({1: {"actor/grad_norm": 100.0, "actor/grad_clip": 0.5}}, 1))
    assert d.fired() == {} and d.metrics[1]["guard/alarm_grad_norm"] == 1.0


# ------------------------------------------------------------------ rule 6: spikes and slow control


def test_spike_needs_history_and_lowers_target_with_cooldown() -> None:
    d = make()
    spike = {"actor/reward_kl_penalty": 0.031}  # > 3 x median 0.01 and > target 0.015
    d.run(steps({5: spike, 6: spike, 7: spike}, 7))
    # step 5: only 4 values of history; step 6: 5 values, spike; step 7: in cooldown
    assert d.fired() == {6: ["lower_target_kl"]}
    a = d.log[6][0]
    assert (a.old, a.new, a.value, a.threshold) == (0.015, pytest.approx(0.01), 0.031, pytest.approx(0.03))
    assert d.metrics[7]["guard/alarm_kl_spike"] == 1.0 and d.metrics[7]["guard/target_kl"] == pytest.approx(0.01)


def test_spike_below_target_is_not_a_spike() -> None:
    d = make()
    d.run(steps({s: {"actor/reward_kl_penalty": 0.001} for s in range(1, 8)} | {8: {"actor/reward_kl_penalty": 0.012}},
                8))
    assert d.fired() == {} and d.metrics[8]["guard/alarm_kl_spike"] == 0.0


def test_a_median_of_rounding_noise_is_no_spike_baseline() -> None:
    # policy == reference: the KL estimates are float rounding around 0, positive here (median 1e-9); KL then jumps
    # well above target_kl. Over a median under spike_median_floor x target_kl (0.1 x 0.015) nothing is a spike,
    # whichever sign the noise has; once the median clears the floor, 3x it is.
    noise = {1: 1e-9, 2: -2e-9, 3: 3e-9, 4: 1e-9, 5: 2e-9}
    d = make()
    d.run(steps({s: {"actor/reward_kl_penalty": v} for s, v in noise.items()} | {6: {"actor/reward_kl_penalty": 0.04}},
                6))
    assert d.fired() == {} and d.metrics[6]["guard/alarm_kl_spike"] == 0.0
    base = {s: {"actor/reward_kl_penalty": 0.0016} for s in range(1, 6)}  # median 0.0016 >= 0.0015: a baseline
    d = make()
    d.run(steps(base | {6: {"actor/reward_kl_penalty": 0.04}}, 6))
    assert d.kinds(6) == ["lower_target_kl"] and d.log[6][0].threshold == pytest.approx(0.0048)


def test_target_never_below_its_floor() -> None:
    d = make(target_kl=0.006, cooldown=0, spike_min_history=1)
    d.run(steps({s: {"actor/reward_kl_penalty": 0.01 * 4**s} for s in range(2, 5)}, 4))
    lowers = [a.new for acts in d.log.values() for a in acts if a.kind == "lower_target_kl"]
    assert lowers == [0.002]  # 0.006 - 0.005 clipped to the floor; then nothing


def test_slow_rule_fires_after_window_consecutive_steps() -> None:
    d = make()
    warm = {"actor/reward_kl_penalty": 0.02}  # above target 0.015, no spike, under the hard limit
    over = {s: warm for s in range(1, 40) if s != 15}
    d.run(steps(over, 35))
    # streak 1..10 -> fire at 10, reset; 11..14 broken at 15; 16..25 -> fire at 25; 26..35 -> 35
    assert [s for s in d.log if d.kinds(s)] == [10, 25, 35]
    a = d.log[10][0]
    assert (a.kind, a.rule, a.old, a.new) == ("raise_kl_coef", "kl_slow", 0.1, pytest.approx(0.12))
    assert d.log[25][0].old == pytest.approx(0.12)  # the driver applied the first raise


def test_slow_rule_is_off_when_no_controller_pursues_target_kl() -> None:
    d = make()
    d.guard.kl_controlled = False  # a fixed coefficient: raising it would make the guard a second controller
    d.run(steps({s: {"actor/reward_kl_penalty": 0.02} for s in range(1, 30)}, 25))
    assert d.fired() == {}
    assert d.metrics[25]["guard/alarm_kl_slow"] == 0.0 and d.metrics[25]["guard/stable"] == 1.0


# ------------------------------------------------------------------ rule 9: hacking detector


def test_length_growth_after_baseline() -> None:
    d = make()
    d.run(steps({11: {"response_length/mean": 15.0}} | {s: {"response_length/mean": 15.1} for s in range(12, 30)}, 23))
    assert d.fired() == {12: ["warn", "raise_kl_coef"], 22: ["warn", "raise_kl_coef"]}
    warn, raise_ = d.log[12]
    assert (warn.rule, warn.metric, warn.value, warn.threshold) == ("hacking", "response_length/mean", 15.1, 15.0)
    assert "response length" in warn.reason and raise_.new == pytest.approx(0.2)  # x2
    assert d.metrics[12]["guard/hacking_alarm"] == 1.0 and d.metrics[12]["guard/hack_length_growth"] == 1.0
    assert d.metrics[11]["guard/hacking_alarm"] == 0.0


def test_no_hacking_signal_while_the_baseline_is_collected() -> None:
    d = make(baseline_window=3)
    d.run(steps({1: {"response_length/mean": 10.0}, 3: {"response_length/mean": 100.0}}, 3))
    assert d.fired() == {}  # step 3's value is part of the baseline


@pytest.mark.parametrize(("length", "corr", "fires"), [(11.1, 0.6, True), (10.9, 0.6, False), (11.1, 0.5, False)])
def test_length_reward_correlation_while_length_grows(length: float, corr: float, fires: bool) -> None:
    d = make(hacking_action="none")
    d.run(steps({11: {"response_length/mean": length, "hacking/length_reward_corr": corr}}, 11))
    assert d.kinds(11) == (["warn"] if fires else [])
    assert d.metrics[11]["guard/hack_length_corr"] == float(fires)


@pytest.mark.parametrize(("entropy", "fires"), [(0.29, True), (0.3, False)])
def test_entropy_collapse(entropy: float, fires: bool) -> None:
    d = make()
    d.run(steps({11: {"actor/entropy": entropy}}, 11))
    assert d.kinds(11) == (["warn", "raise_kl_coef"] if fires else [])


def test_proxy_rising_while_validation_falls() -> None:
    d = make(val_drop_max=0.5, hacking_action="none")
    val = "val-core/arith/acc/mean@1"
    d.guard.observe(0, {val: 0.6})
    over = {5: {val: 0.6}} | {s: {"critic/score/mean": 1.2} for s in range(6, 11)} | {10: {val: 0.58,
                                                                                         "critic/score/mean": 1.2}}
    d.run(steps(over, 12))
    assert d.fired() == {10: ["warn"]}
    assert d.log[10][0].metric == "val-core/*/acc/*" and "validation fell" in d.log[10][0].reason
    assert d.metrics[12]["guard/hack_proxy_val_divergence"] == 1.0  # holds until the next validation


def test_hacking_action_none_only_warns() -> None:
    d = make(hacking_action="none")
    d.run(steps({s: {"response_length/mean": 20.0} for s in range(11, 25)}, 25))
    assert d.fired() == {11: ["warn"], 21: ["warn"]}
    assert QUIET["response_length/mean"] == 10.0


def test_penalty_share_waits_a_cooldown_after_any_kl_coef_raise() -> None:
    # a rollback raises beta x2 at step 3; the share (beta x KL) jumps with it, but the share rule
    # waits until step 13 instead of compounding the raise at step 4
    d = make()
    hard = {"actor/reward_kl_penalty": 0.051}
    d.run(steps({3: hard} | {s: {"actor/kl_seq_sum": 2.5} for s in range(4, 20)}, 15))
    raises = [s for s in d.log if "raise_kl_coef" in d.kinds(s)]
    assert raises == [3, 13]
    assert d.log[13][0].rule == "penalty_share"


@pytest.mark.parametrize(("controlled", "factor", "kinds"), [(False, 2.0, ["raise_kl_coef"]),
                                                              (False, 1.0, ["lower_target_kl"]),
                                                              (True, 2.0, ["lower_target_kl"])])
def test_a_spike_under_a_fixed_coefficient_can_raise_it(controlled: bool, factor: float, kinds: list) -> None:
    """No controller chases target_kl under a fixed coefficient: with spike_kl_coef_factor > 1 the spike raises the
    coefficient there (0.1 -> 0.2); with a controller, or at the default 1, it lowers target_kl as before."""
    guard = KLGuard(seed_config(spike_kl_coef_factor=factor), total_steps=100, target_kl=0.015, kl_coef=0.1,
                    kl_controlled=controlled)
    d = Driver(guard, beta=0.1)
    spike = {"actor/reward_kl_penalty": 0.031}
    d.run(steps({6: spike}, 6))
    assert d.fired() == {6: kinds}
    if kinds == ["raise_kl_coef"]:
        assert (d.log[6][0].old, d.log[6][0].new) == (0.1, pytest.approx(0.2)) and guard.kl_coef == pytest.approx(0.2)
