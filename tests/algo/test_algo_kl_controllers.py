"""KL coefficient controllers: each update step by hand, guards, and state round-trips."""

import json
import math

import pytest

from klguard.algo import kl as kl_mod
from klguard.algo.kl import AdaptiveKLController, FixedKLController, build_kl_controller


def test_fixed_controller_never_moves() -> None:
    ctrl = FixedKLController(0.05)
    for kl, n in [(0.0, 1), (10.0, 1000), (float("nan"), 5)]:
        ctrl.update(kl, n)
        assert ctrl.value == 0.05
    assert FixedKLController(0.0).value == 0.0  # 0 disables the penalty


@pytest.mark.parametrize("bad", [-0.1, float("nan"), float("inf")])
def test_fixed_controller_rejects_bad_coef(bad: float) -> None:
    with pytest.raises(ValueError, match="kl_coef"):
        FixedKLController(bad)


def test_fixed_state_round_trip() -> None:
    state = FixedKLController(0.3).state_dict()
    other = FixedKLController(0.0)
    other.load_state_dict(json.loads(json.dumps(state)))
    assert other.value == 0.3


# init 0.1, target 1.0, horizon 100 in every step below
@pytest.mark.parametrize(
    ("kl", "n_steps", "expected"),
    [
        (1.1, 10, 0.1 * (1 + 0.1 * 10 / 100)),  # error 0.1 -> x1.01 -> 0.101
        (1.0, 10, 0.1),  # on target: error 0 -> unchanged
        (5.0, 10, 0.1 * (1 + 0.2 * 10 / 100)),  # error 4 clipped to 0.2 -> x1.02 -> 0.102
        (0.0, 10, 0.1 * (1 - 0.2 * 10 / 100)),  # error -1 clipped to -0.2 -> x0.98 -> 0.098
        (0.9, 10, 0.1 * (1 - 0.1 * 10 / 100)),  # error -0.1 -> x0.99 -> 0.099
        (1.1, 50, 0.1 * (1 + 0.1 * 50 / 100)),  # n_steps / horizon = 0.5 -> x1.05 -> 0.105
        (1.1, 0, 0.1),  # no samples, no move
    ],
)
def test_adaptive_single_step_by_hand(kl: float, n_steps: int, expected: float) -> None:
    ctrl = AdaptiveKLController(0.1, target_kl=1.0, horizon=100)
    ctrl.update(kl, n_steps)
    assert math.isclose(ctrl.value, expected, rel_tol=1e-12)


def test_adaptive_steps_compound() -> None:
    ctrl = AdaptiveKLController(0.1, target_kl=0.5, horizon=20)
    ctrl.update(0.6, 4)  # error 0.6/0.5 - 1 = 0.2 -> x(1 + 0.2 * 4/20) = x1.04 -> 0.104
    ctrl.update(0.45, 2)  # error -0.1 -> x(1 - 0.1 * 2/20) = x0.99 -> 0.10296
    assert math.isclose(ctrl.value, 0.1 * 1.04 * 0.99, rel_tol=1e-12)


def test_adaptive_ignores_non_finite_kl() -> None:
    ctrl = AdaptiveKLController(0.1, target_kl=1.0, horizon=100)
    for bad in (float("nan"), float("inf"), float("-inf")):
        ctrl.update(bad, 10)
        assert ctrl.value == 0.1


def test_adaptive_value_stays_positive_and_bounded() -> None:
    ctrl = AdaptiveKLController(0.1, target_kl=1.0, horizon=100)
    # error -0.2 with n_steps / horizon = 10 -> x(1 - 2) = x(-1): clamped to the floor
    ctrl.update(0.0, 1000)
    assert ctrl.value == AdaptiveKLController.MIN_VALUE
    ctrl.update(0.0, 1)  # stays at the floor, never 0 or negative
    assert ctrl.value == AdaptiveKLController.MIN_VALUE
    big = AdaptiveKLController(0.1, target_kl=1.0, horizon=1)
    for _ in range(200):
        big.update(1e30, 10**6)  # x(1 + 0.2 * 1e6) per step
    assert big.value == AdaptiveKLController.MAX_VALUE
    assert math.isfinite(big.value)


@pytest.mark.parametrize(
    "kwargs",
    [
        {"init_kl_coef": 0.0},
        {"init_kl_coef": -1.0},
        {"init_kl_coef": float("nan")},
        {"target_kl": 0.0},
        {"target_kl": float("inf")},
        {"horizon": 0},
        {"horizon": -5},
    ],
)
def test_adaptive_rejects_bad_args(kwargs: dict[str, float]) -> None:
    args = {"init_kl_coef": 0.1, "target_kl": 1.0, "horizon": 100} | kwargs
    with pytest.raises(ValueError, match=next(iter(kwargs))):
        AdaptiveKLController(**args)


def test_adaptive_target_can_be_changed() -> None:
    ctrl = AdaptiveKLController(0.1, target_kl=1.0, horizon=100)
    ctrl.target_kl = 2.0
    ctrl.update(2.2, 10)  # error 2.2/2 - 1 = 0.1 -> x1.01
    assert math.isclose(ctrl.value, 0.101, rel_tol=1e-12)
    with pytest.raises(ValueError, match="target_kl"):
        ctrl.target_kl = -1.0
    with pytest.raises(ValueError, match="n_steps"):
        ctrl.update(1.0, -1)


def test_adaptive_state_round_trip() -> None:
    ctrl = AdaptiveKLController(0.2, target_kl=0.3, horizon=50)
    ctrl.update(0.5, 7)
    ctrl.target_kl = 0.25
    state = json.loads(json.dumps(ctrl.state_dict()))
    assert state == {"type": "adaptive", "value": ctrl.value, "target_kl": 0.25, "horizon": 50.0}
    other = AdaptiveKLController(1.0, target_kl=1.0, horizon=1)
    other.load_state_dict(state)
    assert (other.value, other.target_kl, other.horizon) == (ctrl.value, 0.25, 50.0)
    other.update(0.5, 7)
    ctrl.update(0.5, 7)
    assert other.value == ctrl.value
    with pytest.raises(ValueError, match="fixed"):
        other.load_state_dict(FixedKLController(0.1).state_dict())


def test_build_kl_controller() -> None:
    fixed = build_kl_controller("fixed", kl_coef=0.001, target_kl=0.1, horizon=10000)
    assert isinstance(fixed, FixedKLController)
    assert fixed.value == 0.001
    adaptive = build_kl_controller("adaptive", kl_coef=0.01, target_kl=0.2, horizon=500)
    assert isinstance(adaptive, AdaptiveKLController)
    assert (adaptive.value, adaptive.target_kl, adaptive.horizon) == (0.01, 0.2, 500.0)
    with pytest.raises(ValueError, match=r"'nope'.*fixed.*adaptive.*pid"):
        build_kl_controller("nope", kl_coef=0.1, target_kl=0.1, horizon=10)


def test_registry_is_extensible(monkeypatch: pytest.MonkeyPatch) -> None:
    def build_double(*, kl_coef: float, **_: object) -> FixedKLController:
        return FixedKLController(2 * kl_coef)

    monkeypatch.setitem(kl_mod.KL_CONTROLLERS, "double", build_double)
    assert build_kl_controller("double", kl_coef=0.1, target_kl=0.1, horizon=10).value == 0.2
