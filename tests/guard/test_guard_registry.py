"""The registry: a rule or signal is one declaration. A signal declared here, in a test module, is picked up by the
guard, by `klguard watch`'s rule list and by the configuration reference, with no other edit; and every rule the
guard runs is declared once, in klguard/guard/rules/."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest
from guard_streams import QUIET, Driver, steps

from klguard.commands.watch_rules import blind_to, inputs_line, off_line, rules_lines
from klguard.fields import at_least
from klguard.guard import INPUT_METRICS, GuardConfig, GuardRule, GuardSession, Key, KLGuard, register, registry
from klguard.guard.inputs import rules_without_input
from klguard.guard.step import Evidence, Step

ECHO = "hacking/test_echo"
NEW_RULES = ("length_collapse", "length_growth", "entropy_blowup", "reward_collapse", "loss_explosion", "policy_ratio",
             "truncation", "zero_std", "zero_grad", "proxy_correctness")


def measure(step: Step) -> Evidence | None:
    """The echo signal: its metric above its baseline plus `test_echo_rise`."""
    value = step.value(ECHO)
    base = step.baseline("test_echo", value)
    limit = None if base is None else base + step.cfg.test_echo_rise
    return step.limit("test_echo", ECHO, value, limit, True, "test echo")


TEST_ECHO = GuardRule(
    name="test_echo", kind="signal", order=999, reads=((ECHO,),),
    says=lambda c: f"{ECHO} > {c.test_echo_rise:g} over its first {c.baseline_window} steps: hacking",
    sees="a test echo growing",
    keys=(Key("test_echo_rise", 0.2, "hacking/test_echo above baseline + this: hacking signal (a test's)",
              at_least(0), external=0.3),),
    measure=measure)


@pytest.fixture
def echo():
    register(TEST_ECHO)
    try:
        yield TEST_ECHO
    finally:
        registry.unregister(TEST_ECHO.name)


def _gen_results():
    path = Path(__file__).resolve().parents[2] / "docs" / "gen_results.py"
    spec = importlib.util.spec_from_file_location("gen_results", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_guard_runs_a_signal_declared_in_a_test_module(echo):
    cfg = GuardConfig(hacking_signals=["test_echo"], hacking_action="rollback", test_echo_rise=0.25)
    cfg.validate()
    driver = Driver(KLGuard(cfg, total_steps=100, target_kl=0.015, kl_coef=0.1))
    driver.run(steps({12: {ECHO: 1.3}}, 12, base={ECHO: 1.0}))  # baseline 1.0 over steps 1-10, + 0.25
    rollback = driver.log[12][0]
    assert (rollback.kind, rollback.rule, rollback.metric, rollback.threshold) == ("rollback", "hacking", ECHO, 1.25)
    assert "test echo 1.3 is above 1.25" in rollback.reason
    assert driver.metrics[12]["guard/hack_test_echo"] == 1.0 and driver.metrics[11]["guard/hack_test_echo"] == 0.0
    state = json.loads(json.dumps(driver.guard.state_dict()))
    assert state["baselines"]["test_echo"] == [1.0] * 10


def test_a_declared_signal_is_only_logged_until_named(echo):
    driver = Driver(KLGuard(GuardConfig(), total_steps=100, kl_coef=0.1))
    driver.run(steps({12: {ECHO: 9.0}}, 12, base={ECHO: 1.0}))
    assert driver.metrics[12]["guard/hack_test_echo"] == 1.0 and driver.fired() == {}
    with pytest.raises(ValueError, match=r"guard.hacking_signals='nope' is not a signal; known: .*test_echo"):
        GuardConfig(hacking_signals=["nope"]).validate()


def test_watch_lists_a_declared_signal(echo):
    guard = KLGuard(GuardConfig(hacking_signals=["test_echo"]), total_steps=0)
    run, cannot = rules_lines(guard, {ECHO, *QUIET})
    assert f"test_echo: {ECHO} > 0.2 over its first 10 steps: hacking" in run
    _, cannot = rules_lines(guard, set(QUIET))
    assert f"test_echo (no {ECHO})" in cannot
    assert f"a test echo growing (test_echo: no {ECHO})" in blind_to(guard, set(QUIET))
    assert ECHO in inputs_line({ECHO})
    assert "test_echo" in off_line(KLGuard(GuardConfig(), total_steps=0))
    assert "test_echo" in rules_without_input(set(QUIET))


def test_the_configuration_reference_lists_a_declared_signal(echo):
    gen = _gen_results()
    keys = gen.guard_keys()
    assert ("| `guard.test_echo_rise` | test_echo | `0.2` | `0.3` | hacking/test_echo above baseline + this: hacking "
            "signal (a test's) |") in keys
    assert "| `test_echo` | hacking signal | `hacking/test_echo` |" in gen.guard_rules()
    assert "| `test_echo` | no (logged only) | `guard/hack_test_echo` |" in gen.guard_signals()
    assert "| `guard.test_echo_rise` | `0.2` |" in gen.config_keys()
    from klguard.config.schema import Config

    assert Config().guard.test_echo_rise == 0.2  # the schema's section is the class that carries the key


def test_an_unregistered_signal_leaves_nothing_behind():
    register(TEST_ECHO)
    registry.unregister(TEST_ECHO.name)
    assert not hasattr(GuardConfig(), "test_echo_rise")
    assert "test_echo" not in registry.names("signal")
    assert "guard.test_echo_rise" not in _gen_results().guard_keys()


def test_a_name_or_key_is_declared_once(echo):
    with pytest.raises(ValueError, match="declared twice"):
        register(TEST_ECHO)
    twin = GuardRule(name="test_twin", kind="signal", order=1, reads=((ECHO,),), says=str, sees="",
                     keys=(Key("kl_hard_limit", 1.0, "again"),))
    with pytest.raises(ValueError, match=r"keys \['kl_hard_limit'\] are another rule's"):
        register(twin)
    with pytest.raises(ValueError, match="unknown actions"):
        register(GuardRule(name="test_bad", kind="alarm", order=1, reads=(), says=str, sees="", actions=("explode",)))


def test_every_rule_is_declared_once_and_read_by_the_guard():
    """14 alarms, 11 signals (the 4 default ones and 7 opt-in ones), 4 checks; each key belongs to one rule; the
    rules of another trainer's failures say what to do."""
    assert registry.names("alarm") == ("ppo_kl", "grad_norm", "zero_grad", "loss_explosion", "penalty_share",
                                       "kl_hard", "kl_spike", "kl_slow", "val_drop", "reward_collapse",
                                       "proxy_correctness", "policy_ratio", "truncation", "zero_std")
    assert registry.names("signal") == ("length_growth", "length_corr", "entropy_collapse", "kl_growth",
                                        "repetition", "rm_spread", "ref_support", "ref_nll", "rm_outlier",
                                        "audit_gap", "proxy_val_divergence")
    assert registry.names("check") == ("start_up", "nonfinite", "length_collapse", "entropy_blowup")
    assert registry.default_signals() == ["length_growth", "length_corr", "entropy_collapse", "proxy_val_divergence"]
    assert registry.rollback_rules() == ("kl_hard", "val_drop", "reward_collapse", "hacking", "length_collapse",
                                         "entropy_blowup")
    assert registry.reanchor_rules() == ["val_drop", "hacking", "length_collapse"]  # klguard's own default unchanged
    guard = KLGuard(GuardConfig(), total_steps=10, kl_coef=0.1)
    guard.observe(1, QUIET)
    names = set(guard.guard_metrics())
    assert {f"guard/alarm_{r.name}" for r in registry.rules("alarm") if r.flag_when_off} <= names
    assert not any(f"guard/alarm_{n}" in names for n in NEW_RULES)  # off in klguard's own runs: not logged
    assert {f"guard/hack_{n}" for n in registry.names("signal")} <= names
    read = {name for rule in registry.rules() for name in rule.inputs}
    assert read <= set(INPUT_METRICS)
    for rule in registry.rules():
        assert rule.says(GuardConfig()) and rule.sees, rule.name
        assert (rule.measure is not None) == (rule.kind != "check"), rule.name
        assert rule.do or (rule.kind == "check" and not rule.actions) or rule.name not in NEW_RULES, rule.name


def test_each_rules_hint_is_in_the_hosts_keys():
    from klguard.guard import HostKeys

    keys = HostKeys(kl_coef="K", lr="L", save_freq="S", resume="R", guard="+g.")
    session = GuardSession(KLGuard(GuardConfig(), total_steps=1), host=None, keys=keys)
    assert session.hint("kl_hard") == "raise K or +g.kl_hard_limit"
    assert session.hint("hacking") == "raise K or set +g.hacking_action=raise_kl_coef"
    assert session.hint("kl_coef_cap").startswith("lower L")
    assert session.hint("grad_norm") == "adjust the +g.* threshold named above"
