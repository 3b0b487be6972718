"""GuardSession against a fake host: what each action does to the host, the stable checkpoints, rollback targets,
pauses and their hints, the session's own KL controller, and resuming from state_dict."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from guard_streams import QUIET, seed_config, steps

from klguard.algo.kl import build_kl_controller
from klguard.guard import ACTION_KINDS, Action, GuardSession, HostKeys, KLGuard

HARD = {"actor/reward_kl_penalty": 0.051}  # above the seed's kl_hard_limit 0.05: a rollback
ALARM = {"actor/ppo_kl": 0.05}  # above ppo_kl_max 0.025: an alarm (guard/stable 0), no rollback
TRL_KEYS = HostKeys(kl_coef="GRPOConfig beta", lr="learning_rate", save_freq="save_steps",
                    resume="resume_from_checkpoint")


class FakeHost:
    """Records every call but events; `checkpoints`: the steps it can restore; `reference`: whether it can restore
    the reference."""

    def __init__(self, checkpoints=(), reference: bool = True) -> None:
        self.checkpoints, self.reference = set(checkpoints), reference
        self.calls: list[tuple] = []
        self.events: list[dict] = []

    def set_kl_coef(self, value, *, frozen):
        self.calls.append(("set_kl_coef", value, frozen))

    def set_target_kl(self, value):
        self.calls.append(("set_target_kl", value))

    def set_lr_scale(self, scale, ratio):
        self.calls.append(("set_lr_scale", scale, ratio))

    def set_grad_clip(self, clip):
        self.calls.append(("set_grad_clip", clip))

    def restore_checkpoint(self, step):
        self.calls.append(("restore_checkpoint", step))
        return step if step in self.checkpoints else None

    def restore_reference(self, reference_step):
        self.calls.append(("restore_reference", reference_step))
        return reference_step if self.reference else None

    def reanchor_reference(self, step):
        self.calls.append(("reanchor_reference", step))

    def pause(self, reason):
        self.calls.append(("pause", reason))

    def write_event(self, record):
        self.events.append(record)

    def say(self, message):
        self.calls.append(("say", message))


def session(host: FakeHost | None = None, keys: HostKeys | None = None, controller=None, total_steps: int = 100,
            **cfg) -> GuardSession:
    guard = KLGuard(seed_config(**cfg), total_steps=total_steps, target_kl=0.015, kl_coef=0.1)
    return GuardSession(guard, host or FakeHost(), keys, controller)


def action(kind: str, old=None, new=None, rule: str = "test") -> Action:
    return Action(kind, f"{kind} reason.", None, None, None, old, new, 7, rule)


DIRECT = {  # an action applied on its own -> the host calls it makes
    "warn": (action("warn"), []),
    "cut_lr": (action("cut_lr", 0.5, 0.25), [("set_lr_scale", 0.25, 0.5)]),
    "raise_kl_coef": (action("raise_kl_coef", 0.1, 0.3), [("set_kl_coef", 0.3, False)]),
    "lower_target_kl": (action("lower_target_kl", 0.015, 0.01), [("set_target_kl", 0.01)]),
    "set_grad_clip": (action("set_grad_clip", None, 1.0), [("set_grad_clip", 1.0)]),
    "reanchor_reference": (action("reanchor_reference", 0, 4), [("reanchor_reference", 4)]),
}


@pytest.mark.parametrize("kind", sorted(DIRECT))
def test_each_action_calls_its_host_method_and_is_written(kind):
    act, expected = DIRECT[kind]
    host = FakeHost()
    session(host).apply(act)
    assert host.calls == expected
    assert host.events == [act.to_dict()]


def test_every_action_kind_is_tested_here():
    driven = {"freeze_kl_coef", "release_kl_coef", "rollback", "pause"}  # through the guard, below
    assert set(DIRECT) | driven == set(ACTION_KINDS)


def test_the_warmup_freezes_then_releases_the_kl_coefficient():
    """warmup_ratio 0.1 of 20 steps: steps 1-2 run with kl_coef held at 0.05, step 3 with the 0.1 it had."""
    host = FakeHost()
    s = session(host, total_steps=20, warmup_ratio=0.1, warmup_kl_coef=0.05)
    s.observe(0, {})
    assert host.calls == [("set_kl_coef", 0.05, True)] and s.guard.kl_frozen
    s.observe(1, dict(QUIET, **{"actor/reward_kl_penalty_coeff": 0.05}))
    assert len(host.calls) == 1
    s.observe(2, dict(QUIET, **{"actor/reward_kl_penalty_coeff": 0.05}))
    assert host.calls[1:] == [("set_kl_coef", 0.1, False)] and not s.guard.kl_frozen
    assert [e["kind"] for e in host.events] == ["freeze_kl_coef", "release_kl_coef"]


def test_a_session_controller_takes_the_coefficient_the_target_and_the_kl():
    """The host with no controller of its own (TRL): the session's adaptive controller holds the warm-up's 0.05
    without updates, resumes from 0.1, then moves with the KL and takes the guard's target and raise."""
    host = FakeHost()
    ctrl = build_kl_controller("adaptive", kl_coef=0.1, target_kl=0.01, horizon=100)
    s = session(host, controller=ctrl, total_steps=20, warmup_ratio=0.1, warmup_kl_coef=0.05)
    s.observe(0, {})
    s.update_kl(0.02, n_steps=10)
    assert ctrl.value == 0.05 and host.calls == [("set_kl_coef", 0.05, True)]
    for step in (1, 2):
        s.observe(step, QUIET)
    assert ctrl.value == 0.1 and host.calls[-1] == ("set_kl_coef", 0.1, False)
    s.update_kl(0.02, n_steps=10)  # error clipped to 0.2: 0.1 x (1 + 0.2 x 10 / 100)
    assert ctrl.value == pytest.approx(0.102)
    s.apply(action("lower_target_kl", 0.01, 0.005))
    assert ctrl.target_kl == 0.005 and host.calls[-1] == ("set_target_kl", 0.005)
    s.apply(action("raise_kl_coef", 0.102, 0.2))
    assert ctrl.value == 0.2 and host.calls[-1] == ("set_kl_coef", 0.2, False)


def test_the_pending_checkpoint_becomes_stable_when_the_next_step_is_calm():
    s = session()
    s.pending = 2
    s.observe(3, QUIET)
    assert s.stable == [2] and s.pending is None
    s.pending = 3
    s.observe(4, dict(QUIET, **ALARM))
    assert s.stable == [2] and s.pending is None  # step 4's alarm: checkpoint 3 is not a rollback target
    s.pending = 4
    s.observe(5, QUIET, measured=False)  # a skipped step did not measure checkpoint 4's weights
    assert s.stable == [2] and s.pending is None


def test_no_promotion_at_a_rollback_step_even_though_the_guard_is_calm_after_it():
    host = FakeHost(checkpoints={2})
    s = session(host)
    s.pending, s.stable = 4, [2]
    s.observe(5, dict(QUIET, **HARD))
    assert s.guard.is_stable()  # on_rollback cleared the alarms: only the rollback itself keeps 4 out
    assert s.stable == [2] and s.last_rollback_step == 5


def test_a_rollback_restores_the_newest_stable_checkpoint_that_exists_then_tightens():
    """Checkpoint 6 is gone: 4 is restored, the reference re-anchored there, then target_kl 0.015 -> 0.01,
    kl_coef 0.1 x 2 and the lr scale x 0.5, in the guard's order."""
    host = FakeHost(checkpoints={2, 4})
    s = session(host, reanchor_on_rollback=True, reanchor_rules=["kl_hard"], rollback_lr_factor=0.5)
    s.stable = [2, 4, 6]
    s.observe(5, dict(QUIET, **HARD))
    assert host.calls == [("restore_checkpoint", 6), ("restore_checkpoint", 4), ("reanchor_reference", 4),
                          ("set_target_kl", pytest.approx(0.01)), ("set_kl_coef", pytest.approx(0.2), False),
                          ("set_lr_scale", 0.5, 0.5)]
    assert [e["kind"] for e in host.events] == ["rollback", "reanchor_reference", "lower_target_kl",
                                                "raise_kl_coef", "cut_lr"]
    assert host.events[0]["restored_step"] == 4
    assert s.guard.reference_step == 4 and s.guard.lr_scale == 0.5 and s.pause_reason is None


def test_with_no_stable_checkpoint_the_reference_is_restored():
    host = FakeHost(checkpoints=set())
    s = session(host, reanchor_on_rollback=True)
    s.stable = [3]
    s.observe(5, dict(QUIET, **HARD))
    assert host.calls[:2] == [("restore_checkpoint", 3), ("restore_reference", 0)]
    assert ("reanchor_reference", 0) not in host.calls  # the reference already holds step 0's policy
    assert host.events[0]["kind"] == "rollback" and host.events[0]["restored_step"] == 0
    assert s.pause_reason is None


def test_with_neither_a_checkpoint_nor_the_reference_it_pauses():
    host = FakeHost(reference=False)
    s = session(host, TRL_KEYS, reanchor_on_rollback=True)
    s.observe(5, dict(QUIET, **HARD))
    rollback = host.events[0]
    assert rollback["kind"] == "rollback" and rollback["restored_step"] is None
    reason = (f"{rollback['reason']} No stable checkpoint is on disk and the reference cannot be restored: paused "
              "instead (set save_steps).")
    assert host.calls == [("restore_reference", 0), ("pause", reason), ("say", f"klguard: paused at step 5: {reason}"),
                          ("set_target_kl", pytest.approx(0.01)),
                          ("set_kl_coef", pytest.approx(0.2), False)]  # no re-anchoring: nothing was restored
    assert s.pause_reason == reason


def test_a_pause_carries_the_hosts_hint():
    host = FakeHost()
    s = session(host, TRL_KEYS, max_rollbacks=0)
    s.observe(5, dict(QUIET, **HARD))
    event = host.events[-1]
    assert event["kind"] == "pause" and event["to_go_on"] == "raise GRPOConfig beta or guard.kl_hard_limit"
    expected = (f"{event['reason']} To go on: raise GRPOConfig beta or guard.kl_hard_limit, then "
                "resume_from_checkpoint.")
    assert host.calls == [("pause", expected), ("say", f"klguard: paused at step 5: {expected}")]
    assert s.pause_reason == expected


def test_hints_spell_the_hosts_keys_and_fall_back_to_the_guards():
    keys = HostKeys(kl_coef="algorithm.kl_ctrl.kl_coef", lr="actor_rollout_ref.actor.optim.lr",
                    save_freq="trainer.save_freq", resume="rerun")
    s = session(keys=keys)
    assert s.hint("kl_slow") == "lower actor_rollout_ref.actor.optim.lr or raise algorithm.kl_ctrl.target_kl"
    assert s.hint("grad_norm") == "adjust the guard.* threshold named above"
    verl = session(keys=HostKeys(kl_coef="k", lr="l", save_freq="s", resume="r", guard="+klguard.guard."))
    assert verl.hint("kl_hard") == "raise k or +klguard.guard.kl_hard_limit"
    assert session().hint("kl_hard") is None


def test_without_keys_a_pause_is_the_guards_reason_alone():
    host = FakeHost()
    s = session(host, max_rollbacks=0)
    s.observe(5, dict(QUIET, **HARD))
    reason = host.events[-1]["reason"]
    assert "to_go_on" not in host.events[-1]
    assert host.calls == [("pause", reason), ("say", f"klguard: paused at step 5: {reason}")]


def _history(s: GuardSession) -> None:
    """Steps 1-6, checkpoints after 2 and 4 (both confirmed calm), 6 pending; an adaptive controller moved."""
    for step, metrics in steps({}, 6):
        s.update_kl(0.02, n_steps=10)
        s.observe(step, metrics)
        if step % 2 == 0:
            s.pending = step


def test_state_dict_round_trip_takes_the_same_later_decisions():
    def fresh(host):
        ctrl = build_kl_controller("adaptive", kl_coef=0.1, target_kl=0.01, horizon=100)
        return session(host, TRL_KEYS, ctrl, reanchor_on_rollback=True, reanchor_rules=["kl_hard"])

    whole = fresh(FakeHost(checkpoints={2, 4}))
    _history(whole)
    saved = json.loads(json.dumps(whole.state_dict()))
    assert (saved["stable"], saved["pending"]) == ([2, 4], 6)
    resumed = fresh(FakeHost(checkpoints={2, 4}))
    resumed.load_state_dict(saved)
    later = steps({8: HARD}, 9, start=7)  # 7 confirms 6 (not on disk: skipped), 8 rolls back to 4
    for s in (whole, resumed):
        for step, metrics in later:
            s.update_kl(0.02, n_steps=10)
            s.observe(step, metrics)
    assert resumed.host.calls == whole.host.calls
    assert resumed.host.calls[:3] == [("restore_checkpoint", 6), ("restore_checkpoint", 4), ("reanchor_reference", 4)]
    assert resumed.host.events == [e for e in whole.host.events if e["step"] > 6]
    assert resumed.state_dict() == whole.state_dict()
    assert resumed.controller.value == whole.controller.value != 0.1


def test_the_session_runs_without_torch():
    code = "import sys, klguard.guard.session; sys.exit('torch' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code], check=False).returncode == 0


# ------------------------------------------------------------------ what the session owns for every host

def test_a_checkpoint_is_pending_whenever_the_host_writes_it():
    """After the step's metrics (klguard's trainer, TRL) it is pending at once; during the step, before them (verl),
    once they are observed, unless that step rolled back; either way the next step judges it."""
    after = session()
    after.observe(2, QUIET)
    assert after.checkpoint(2)["pending"] == 2 and after.pending == 2
    after.observe(3, QUIET)
    assert after.stable == [2]
    during = session()
    during.observe(1, QUIET)
    assert during.checkpoint(2)["pending"] is None  # written before step 2's metrics: not yet pending
    during.observe(2, QUIET)
    assert during.pending == 2
    during.observe(3, QUIET)
    assert during.stable == [2]
    rolled = session(FakeHost(checkpoints={2}))
    rolled.stable = [2]
    rolled.observe(3, QUIET)
    rolled.checkpoint(4)
    rolled.observe(4, dict(QUIET, **HARD))  # checkpoint 4 holds the weights that blew up
    assert rolled.pending is None and rolled.stable == [2]


def test_a_checkpoint_not_written_is_not_judged():
    s = session()
    s.observe(2, QUIET)
    s.checkpoint(2)
    s.drop_checkpoint(2)
    s.observe(3, QUIET)
    assert s.stable == [] and s.pending is None


def test_the_state_is_versioned_and_carries_the_hosts_keys(tmp_path):
    from klguard.guard.state import STATE_VERSION

    s = session()
    s.observe(2, QUIET)
    state = s.checkpoint(2, relaunch={"lr": 0.1})
    assert (state["version"], state["guard"]["version"], state["relaunch"]) == (STATE_VERSION, STATE_VERSION,
                                                                                  {"lr": 0.1})
    GuardSession.save_state(tmp_path / "state.json", state)
    assert not list(tmp_path.glob(".*"))  # written whole: no temporary file left
    read = GuardSession.read_state(tmp_path / "state.json")
    assert read == state and GuardSession.read_state(tmp_path / "none.json") is None
    resumed = session()
    assert resumed.load_state_dict(read) == {"relaunch": {"lr": 0.1}}
    assert resumed.state_dict() == s.state_dict() and resumed.pending == 2
    with pytest.raises(ValueError, match="version 99 is not supported"):
        resumed.load_state_dict({**read, "version": 99})
    (tmp_path / "future.json").write_text(json.dumps({**read, "version": 99}))
    with pytest.raises(ValueError, match=r"future\.json: klguard state version 99 is not supported"):
        GuardSession.read_state(tmp_path / "future.json")
    with pytest.raises(ValueError, match=r"host state keys \['guard'\] are the session's"):
        s.state_dict(guard=1)


def test_a_state_of_klguards_trainer_without_a_version_loads():
    """Before version 2 klguard's trainer wrote the session's state with no version of its own."""
    s = session()
    for step, metrics in steps({}, 3):
        s.observe(step, metrics)
    old = {k: v for k, v in s.state_dict().items() if k != "version"}
    resumed = session()
    resumed.load_state_dict(old)
    assert resumed.state_dict() == s.state_dict()


def test_the_warmup_holds_a_hosts_own_controller():
    """A host with its own controller (klguard's trainer) steps it through the session, which skips it while the
    warm-up holds the coefficient; held_kl_coef is what a host whose controller cannot hold (verl) sets again."""
    ctrl = build_kl_controller("adaptive", kl_coef=0.1, target_kl=0.01, horizon=100)
    s = session(total_steps=20, warmup_ratio=0.1, warmup_kl_coef=0.05)
    s.observe(0, {})
    assert s.held_kl_coef == 0.05
    s.update_kl(0.02, 10, ctrl)
    assert ctrl.value == 0.1  # held: no update
    s.observe(1, dict(QUIET, **{"actor/reward_kl_penalty_coeff": 0.05}))
    s.observe(2, dict(QUIET, **{"actor/reward_kl_penalty_coeff": 0.05}))
    assert s.held_kl_coef is None
    s.update_kl(0.02, 10, ctrl)
    assert ctrl.value == pytest.approx(0.102)


def test_build_makes_the_guard_from_the_config_and_the_hosts_kl():
    from klguard.guard import GuardConfig, KLSetup

    host = FakeHost()
    s = GuardSession.build(GuardConfig(kl_hard_limit=0.3), host, total_steps=10, keys=TRL_KEYS,
                           kl=KLSetup(target_kl=0.02, kl_coef=0.4, controlled=False, metric="actor/kl_loss"))
    guard = s.guard
    assert (guard.cfg.kl_hard_limit, guard.total_steps, guard.target_kl, guard.kl_coef) == (0.3, 10, 0.02, 0.4)
    assert (guard.kl_controlled, guard.kl_metric, s.host, s.keys) == (False, "actor/kl_loss", host, TRL_KEYS)
    assert GuardSession.build(GuardConfig(), host, total_steps=1).guard.target_kl == 0.015  # one node's default


def test_a_pause_of_the_hosts_own_is_said_at_its_step():
    host = FakeHost()
    s = session(host)
    s.observe(4, QUIET)
    s.pause("4 steps in a row had non-finite values.", 4)
    assert host.calls == [("pause", "4 steps in a row had non-finite values."),
                          ("say", "klguard: paused at step 4: 4 steps in a row had non-finite values.")]


def test_a_rule_without_input_in_the_first_steps_is_named_once() -> None:
    """A trainer that logs no KL per sequence (and no token-mean KL with a length to derive it from) leaves kl_growth
    blind: after the baseline window the session says so, once, with the metric it lacks."""
    host = FakeHost()
    s = session(host, baseline_window=3, hacking_signals=["kl_growth", "length_growth"])
    without = {k: v for k, v in QUIET.items() if k not in ("actor/kl_seq_sum", "actor/reward_kl_penalty")}
    for step in range(1, 7):
        s.observe(step, without)
    said = [c[1] for c in host.calls if c[0] == "say"]
    assert len(said) == 1 and said[0].startswith("klguard: no input in the first 3 steps for ")
    assert "kl_growth (actor/kl_seq_sum)" in said[0] and "length_growth" not in said[0]
    assert "kl_hard (actor/reward_kl_penalty or actor/kl_loss)" in said[0]  # no KL at all: the KL rules too


def test_a_run_that_logs_every_input_hears_nothing_of_them() -> None:
    host = FakeHost()
    s = session(host, baseline_window=3, hacking_signals=["kl_growth", "length_growth"])
    for step in range(1, 5):
        s.observe(step, QUIET)
    said = " ".join(c[1] for c in host.calls if c[0] == "say")
    assert "kl_growth" not in said and "kl_hard" not in said and "length_growth" not in said


def test_the_missing_validation_score_is_named_as_the_guard_reads_it() -> None:
    """With `guard.val_metric` set (a user without gold reads the reward's own held-out score), a run that never
    validates hears that name, not the default gold one."""
    host = FakeHost()
    s = session(host, baseline_window=2, val_metric="val-aux/*/score/*")
    for step in range(1, 3):
        s.observe(step, QUIET)
    said = " ".join(c[1] for c in host.calls if c[0] == "say")
    assert "val_drop (val-aux/*/score/*)" in said and "val-core" not in said


def test_the_step_that_rolls_back_logs_the_flags_its_rules_raised() -> None:
    """A rollback clears the guard's alarms and signals for the steps after it; the rolled-back step's own row still
    says that kl_hard and kl_growth (3x its baseline of 0.1, above the floor 0.2) fired there."""
    s = session(FakeHost(checkpoints=set()), hacking_signals=["kl_growth"], hacking_action="none",
                kl_growth_min=0.2)
    rows = []
    for step, metrics in steps({11: {**HARD, "actor/kl_seq_sum": 0.5}}, 12):
        s.observe(step, metrics)
        rows.append(s.guard_metrics())
    assert rows[10]["guard/alarm_kl_hard"] == 1.0 and rows[10]["guard/hack_kl_growth"] == 1.0
    assert rows[10]["guard/rollbacks"] == 1.0  # the state after the step's actions
    assert rows[11]["guard/alarm_kl_hard"] == 0.0 and rows[11]["guard/hack_kl_growth"] == 0.0
    assert not s.guard.guard_metrics()["guard/hack_kl_growth"]  # the guard itself was cleared by the rollback
