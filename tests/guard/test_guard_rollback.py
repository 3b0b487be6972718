"""Rollbacks (rules 4 and 5), their bound, on_rollback, stable checkpoints and the warm-up (rule 7)."""

from __future__ import annotations

import pytest
from guard_streams import QUIET, make, steps

from klguard.guard import registry

VAL = "val-core/arith/acc/mean@1"
HARD = {"actor/reward_kl_penalty": 0.051}


def test_kl_hard_limit_rolls_back_and_tightens() -> None:
    d = make()
    d.run(steps({3: {"actor/reward_kl_penalty": 0.05}, 4: HARD}, 4))  # 0.05 is not above the limit
    assert d.fired() == {4: ["rollback", "lower_target_kl", "raise_kl_coef"]}
    rollback, lower, raise_ = d.log[4]
    assert (rollback.rule, rollback.metric, rollback.value, rollback.threshold) == (
        "kl_hard", "actor/reward_kl_penalty", 0.051, 0.05)
    assert (rollback.old, rollback.new) == (0, 1)
    assert (lower.old, lower.new) == (0.015, pytest.approx(0.01))
    assert (raise_.old, raise_.new) == (0.1, pytest.approx(0.2))
    assert d.metrics[4]["guard/rollbacks"] == 1.0 and d.metrics[4]["guard/alarm_kl_hard"] == 1.0


def test_kl_loss_is_the_fallback_kl() -> None:
    d = make()
    stream = steps({2: {"actor/kl_loss": 0.06}}, 2)
    for _, m in stream:
        m.pop("actor/reward_kl_penalty")
    d.run(stream)
    assert d.kinds(2)[0] == "rollback" and d.log[2][0].metric == "actor/kl_loss"


def test_rollbacks_are_bounded_then_pause() -> None:
    d = make(hold_steps=0)  # every tightening counts as held: max_rollbacks alone bounds them
    for step in (5, 10, 15, 20, 25):
        d.run(steps({step: HARD}, step, start=step))
        if d.kinds(step)[0] == "rollback":
            d.guard.on_rollback(step - 3)
    assert [d.kinds(s)[0] for s in (5, 10, 15, 20, 25)] == ["rollback"] * 3 + ["pause"] * 2
    assert d.log[20] == d.log[20][:1]  # a pause alone: no tightening, no rollback
    assert "3 rollbacks are used" in d.log[20][0].reason
    assert d.guard.rollbacks == 3
    assert d.guard.target_kl == pytest.approx(0.002)  # 0.015 -> 0.01 -> 0.005 -> floor
    assert d.guard.kl_coef == pytest.approx(0.8)  # 0.1 x 2 x 2 x 2


@pytest.mark.parametrize(("calm", "second"), [(3, "pause"), (10, "rollback")])
def test_a_rollback_whose_tightening_did_not_hold_pauses(calm, second) -> None:
    """No ratchet: a trigger within guard.hold_steps calm steps of a rollback pauses instead of tightening again."""
    d = make(hold_steps=10)
    d.run(steps({5: HARD}, 5, start=5))
    d.guard.on_rollback(2)
    calm_kl = {"actor/reward_kl_penalty": 0.005}  # under the lowered target_kl (0.01): no kl_slow either
    d.run(steps({s: calm_kl for s in range(6, 6 + calm)}, 5 + calm, start=6))  # calm steps after the restore
    trigger = 6 + calm
    d.run(steps({trigger: HARD}, trigger, start=trigger))
    assert d.kinds(trigger)[0] == second
    if second == "pause":
        assert d.kinds(trigger) == ["pause"] and d.guard.rollbacks == 1  # no second tightening
        assert f"{calm} calm steps after rollback 1 (guard.hold_steps=10)" in d.log[trigger][0].reason
    else:
        assert d.guard.rollbacks == 2 and d.metrics[trigger]["guard/rollbacks"] == 2.0


def test_max_rollbacks_zero_pauses_at_once() -> None:
    d = make(max_rollbacks=0)
    d.run(steps({1: HARD}, 1))
    assert d.kinds(1) == ["pause"]


def test_validation_drop_rolls_back() -> None:
    d = make()
    d.guard.observe(0, {VAL: 0.6})
    vals = {5: {VAL: 0.62, "val-aux/arith/score/mean@1": 0.0}, 10: {VAL: 0.59}, 15: {VAL: 0.58}}
    d.run(steps(vals, 16))
    # best 0.62: 0.59 is a 4.8% drop (quiet), 0.58 a 6.5% drop
    assert d.fired() == {15: ["rollback", "lower_target_kl", "raise_kl_coef"]}
    assert d.log[15][0].threshold == pytest.approx(0.62 * 0.95) and d.log[15][0].rule == "val_drop"
    assert d.metrics[16]["guard/alarm_val_drop"] == 1.0  # holds until the next validation


@pytest.mark.parametrize(("second", "fires"), [(0.58, True), (0.61, False)])
def test_with_val_patience_2_a_validation_drop_must_hold_for_two_validations(second: float, fires: bool) -> None:
    d = make(val_patience=2)
    d.guard.observe(0, {VAL: 0.62})
    d.run(steps({5: {VAL: 0.58}, 10: {VAL: second}}, 11))  # 0.58: 6.5% under the best 0.62; 0.61: 1.6%
    assert d.metrics[5]["guard/alarm_val_drop"] == 1.0 and d.metrics[5]["guard/stable"] == 0.0
    assert d.kinds(5) == []  # one low validation: an alarm, no rollback
    assert (d.kinds(10)[:1] == ["rollback"]) is fires
    if fires:
        assert d.log[10][0].rule == "val_drop" and d.log[10][0].value == 0.58


def test_with_val_patience_2_the_divergence_needs_two_falling_validations() -> None:
    d = make(val_patience=2, hacking_action="none", val_drop_max=0.5)
    d.guard.observe(0, {VAL: 0.9})
    rising = {s: {"critic/score/mean": 1.0 + 0.1 * s} for s in range(1, 21)}
    d.run(steps(rising | {5: {**rising[5], VAL: 0.85}, 10: {**rising[10], VAL: 0.9},
                          15: {**rising[15], VAL: 0.85}, 20: {**rising[20], VAL: 0.8}}, 20))
    # 5: fell once (0.9 -> 0.85); 10: rose; 15: fell once more; 20: fell a second time in a row
    assert [d.metrics[s]["guard/hack_proxy_val_divergence"] for s in (5, 10, 15, 20)] == [0.0, 0.0, 0.0, 1.0]


def test_validation_score_is_the_mean_of_val_core_acc() -> None:
    d = make()
    d.guard.observe(0, {VAL: 0.8, "val-core/gsm8k/acc/mean@1": 0.4, "val-core/gsm8k/reward/mean@1": 100.0})
    assert d.guard.guard_metrics()["guard/val_best"] == pytest.approx(0.6)


def test_on_rollback_clears_windows_but_keeps_tightening() -> None:
    d = make()
    warm = {"actor/reward_kl_penalty": 0.02}
    d.run(steps({s: warm for s in range(1, 9)} | {9: HARD}, 9))
    assert d.kinds(9)[0] == "rollback"
    assert d.guard.on_rollback(5) == []
    assert d.guard.is_stable() and d.guard.target_kl == pytest.approx(0.01)
    # The slow streak restarted: KL above the new target 0.01 from step 6 fires at step 15, not earlier
    d.run(steps({s: warm for s in range(6, 20)}, 15, start=6))
    assert [s for s in range(6, 16) if d.kinds(s)] == [15]


def test_is_stable() -> None:
    d = make()
    d.guard.observe(0, {VAL: 0.6})
    d.run(steps({}, 3))
    assert d.guard.is_stable() and d.metrics[3]["guard/stable"] == 1.0
    d.run(steps({4: {VAL: 0.58}}, 4, start=4))  # falling by 3.3% > 2%, not yet a 5% drop
    assert d.fired() == {} and not d.guard.is_stable()
    d.run(steps({5: {VAL: 0.585}}, 5, start=5))
    assert d.guard.is_stable()
    d.run(steps({6: {"actor/grad_norm": 11.0}}, 6, start=6))  # an alarm (grad clip already on)
    assert not d.guard.is_stable()
    d.run(steps({}, 7, start=7))
    assert d.guard.is_stable()


def test_a_checkpoint_whose_kl_is_past_stable_kl_share_of_the_limit_is_no_rollback_target() -> None:
    near = {"actor/reward_kl_penalty": 0.04}  # under the hard limit 0.05, above half of it
    d = make(stable_kl_share=1.0)
    d.run(steps({3: near}, 3))
    assert d.fired() == {} and d.guard.is_stable()  # share 1.0: anything under the limit
    d = make(stable_kl_share=0.5)
    d.run(steps({3: near}, 3))
    assert d.fired() == {} and not d.guard.is_stable() and d.metrics[3]["guard/stable"] == 0.0
    d.run(steps({4: {"actor/reward_kl_penalty": 0.025}}, 4, start=4))  # exactly half: a target again
    assert d.guard.is_stable()


def test_a_kl_spike_leaves_a_checkpoint_stable_while_the_kl_is_within_stable_kl_share() -> None:
    # kl_spike only lowers target_kl: it says nothing against the weights, whose KL stable_kl_share judges. On a real
    # model a restart from the initial policy grows its KL 3x its short post-rollback median long before any limit.
    kl = {s: {"actor/reward_kl_penalty": 0.005} for s in range(1, 6)}  # median 0.005: 3x is 0.015
    d = make(stable_kl_share=0.5)  # hard limit 0.05: stable up to 0.025
    d.run(steps(kl | {6: {"actor/reward_kl_penalty": 0.02}, 7: {"actor/reward_kl_penalty": 0.03}}, 7))
    assert d.kinds(6) == ["lower_target_kl"] and d.metrics[6]["guard/alarm_kl_spike"] == 1.0
    assert d.metrics[6]["guard/stable"] == 1.0  # a spike at 0.02 <= 0.025
    assert d.metrics[7]["guard/alarm_kl_spike"] == 1.0 and d.metrics[7]["guard/stable"] == 0.0  # 0.03: its level
    assert "kl_spike" in registry.advisory_alarms() and not {"kl_hard", "grad_norm"} & registry.advisory_alarms()


# ------------------------------------------------------------------ rule 7: warm-up


def test_warmup_freeze_and_release_boundaries() -> None:
    d = make(total_steps=50, warmup_kl_coef=0.0)  # 20% of 50: steps 1..10 frozen
    assert [d.guard.in_warmup(s) for s in (0, 1, 10, 11)] == [True, True, True, False]
    start = d.guard.observe(0, {})
    assert [(a.kind, a.old, a.new) for a in start] == [("freeze_kl_coef", 0.1, 0.0)]
    d.beta = 0.0
    warm = {"actor/reward_kl_penalty": 0.02}  # KL above target: the slow rule would raise kl_coef
    d.run(steps({s: warm for s in range(1, 30)}, 12))
    assert d.fired() == {10: ["release_kl_coef", "raise_kl_coef"]}
    release, raise_ = d.log[10]
    assert (release.old, release.new) == (0.0, 0.1)  # resumes from the configured value
    assert (raise_.old, raise_.new) == (0.1, pytest.approx(0.12))  # raised after the release, not during
    assert d.metrics[9]["guard/in_warmup"] == 1.0 and d.metrics[10]["guard/in_warmup"] == 0.0


def test_no_warmup_by_default() -> None:
    d = make()
    assert not d.guard.in_warmup(1) and d.guard.observe(0, {}) == []


def test_warmup_without_step_zero_freezes_at_step_one() -> None:
    d = make(total_steps=10, warmup_kl_coef=0.001, kl_coef=None)
    d.run(steps({}, 3))
    assert d.fired() == {1: ["freeze_kl_coef"], 2: ["release_kl_coef"]}  # warm-up: steps 1..2
    assert d.log[1][0].old == QUIET["actor/reward_kl_penalty_coeff"] and d.log[2][0].new == 0.1


def test_rollback_into_warmup_freezes_again() -> None:
    d = make(total_steps=50, warmup_kl_coef=0.01)
    d.guard.observe(0, {})
    d.run(steps({12: HARD}, 12))
    assert d.kinds(10) == ["release_kl_coef"] and d.kinds(12)[0] == "rollback"
    again = d.guard.on_rollback(5)
    assert [(a.kind, a.new) for a in again] == [("freeze_kl_coef", 0.01)]
    assert d.guard.in_warmup(6)


def test_a_rollback_can_also_cut_the_lr() -> None:
    d = make(rollback_lr_factor=0.5)
    d.run(steps({4: HARD}, 4))
    assert d.fired() == {4: ["rollback", "lower_target_kl", "raise_kl_coef", "cut_lr"]}
    cut = d.log[4][3]
    assert (cut.rule, cut.old, cut.new) == ("kl_hard", 1.0, 0.5)
    assert d.metrics[4]["guard/lr_scale"] == 0.5


def test_a_rollback_reanchors_the_reference_once_per_restored_step() -> None:
    d = make(reanchor_on_rollback=True, reanchor_rules=["kl_hard"])
    d.run(steps({4: HARD}, 4))
    follow = d.guard.on_rollback(3)
    assert [a.kind for a in follow] == ["reanchor_reference"]
    assert (follow[0].old, follow[0].new, follow[0].rule) == (0, 3, "rollback")
    assert d.guard.state_dict()["reference_step"] == 3
    assert d.guard.on_rollback(3) == []  # the reference already holds step 3
    assert [a.new for a in d.guard.on_rollback(0)] == [0]  # back to the initial policy


def test_a_kl_hard_rollback_keeps_the_reference_and_a_validation_rollback_moves_it() -> None:
    d = make(reanchor_on_rollback=True)  # reanchor_rules as shipped: every rule but kl_hard
    d.run(steps({4: HARD}, 4))
    assert d.log[4][0].rule == "kl_hard"
    assert d.guard.on_rollback(3) == [] and d.guard.reference_step == 0  # the policy strayed: keep the start
    d = make(reanchor_on_rollback=True)
    d.guard.observe(0, {VAL: 0.6})
    d.run(steps({4: {VAL: 0.5}}, 4))  # 17% below the best validation
    assert d.log[4][0].rule == "val_drop"
    assert [a.kind for a in d.guard.on_rollback(2)] == ["reanchor_reference"] and d.guard.reference_step == 2


def test_only_the_first_reanchor_rollbacks_move_the_reference() -> None:
    d = make(reanchor_on_rollback=True, reanchor_rules=["kl_hard"], reanchor_rollbacks=1, hold_steps=0)
    d.run(steps({4: HARD}, 4))
    assert [a.kind for a in d.guard.on_rollback(3)] == ["reanchor_reference"]
    d.run(steps({9: HARD}, 9, start=5))
    assert d.kinds(9)[0] == "rollback" and d.guard.rollbacks == 2
    assert d.guard.on_rollback(7) == []  # the second rollback restores step 7 and keeps the reference at step 3
    assert d.guard.reference_step == 3


def test_a_checkpoint_taken_while_the_length_drifts_is_no_rollback_target() -> None:
    # baseline 10 tokens over steps 1-10 (seed threshold for an alarm: 15); stable up to 13
    d = make(stable_length_growth=0.3, stable_length_window=2)
    d.run(steps({12: {"response_length/mean": 16.0}, 13: {"response_length/mean": 10.2},
                 14: {"response_length/mean": 10.4}}, 14))
    # 12: alarm (16 > 15); 13: no alarm but the recent mean (16 + 10.2) / 2 = 13.1 > 13; 14: calm again
    assert [d.metrics[s]["guard/stable"] for s in (11, 12, 13, 14)] == [1.0, 0.0, 0.0, 1.0]
    assert d.metrics[13]["guard/hacking_alarm"] == 0.0


NO_GOLD = "val-aux/*/score/*"
RM_VAL = "val-aux/arith/score/mean@1"


@pytest.mark.parametrize(("val_metric", "fires"), [("val-core/*/acc/*", True), (NO_GOLD, False)])
def test_with_no_gold_the_falling_gold_is_not_read(val_metric: str, fires: bool) -> None:
    """guard.val_metric picks the validation score: with the RM's own score no rule reads the gold accuracy."""
    d = make(val_metric=val_metric, val_patience=1)
    d.guard.observe(0, {VAL: 0.8, RM_VAL: 1.0})
    d.run(steps({5: {VAL: 0.5, RM_VAL: 1.5}}, 5))  # gold fell 37%, the RM's score rose
    assert (d.kinds(5)[:1] == ["rollback"]) is fires
    assert d.guard.guard_metrics()["guard/val_best"] == pytest.approx(0.8 if fires else 1.5)


def test_with_no_gold_a_falling_rm_score_rolls_back_and_names_its_metric() -> None:
    d = make(val_metric=NO_GOLD, val_patience=1)
    d.guard.observe(0, {VAL: 0.8, RM_VAL: 2.0})
    d.run(steps({5: {VAL: 0.8, RM_VAL: 1.8}}, 5))  # the RM's score 10% under its best; gold held
    rollback = d.log[5][0]
    assert (rollback.kind, rollback.rule, rollback.metric, rollback.value) == ("rollback", "val_drop", NO_GOLD, 1.8)


def test_an_empty_val_metric_is_rejected() -> None:
    with pytest.raises(ValueError, match=r"guard\.val_metric"):
        make(val_metric=" ")
