"""PID KL controller: steps by hand, anti-windup, settling on a simulated KL ~ c / beta plant, state."""

from __future__ import annotations

import itertools
import json
import math
import random
import statistics

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from klguard.algo.kl import AdaptiveKLController, PIDKLController, build_kl_controller

TARGET = 0.015
BETA_STAR = 0.1  # the plant's equilibrium: KL = TARGET exactly when beta = BETA_STAR
C = BETA_STAR * TARGET


def simulate(
    ctrl: PIDKLController, alpha: float, n: int, noise: float = 0.0, seed: int = 0, kl0: float | None = None
) -> tuple[list[float], list[float]]:
    """KL relaxes towards c / beta at rate alpha per step in log space (alpha = 1: immediate response).

    The controller sees the KL with multiplicative log-normal noise. Returns the true log errors
    log(KL / target) before each update, and the coefficients.
    """
    rng = random.Random(seed)
    y = math.log(C / ctrl.value) if kl0 is None else math.log(kl0)
    errors, betas = [], []
    for _ in range(n):
        errors.append(y - math.log(TARGET))
        betas.append(ctrl.value)
        ctrl.update(math.exp(y + noise * rng.gauss(0.0, 1.0)), 64)
        y = (1 - alpha) * y + alpha * math.log(C / ctrl.value)
    return errors, betas


def settling_step(errors: list[float], tol: float = math.log(1.1)) -> int | None:
    """First step after which the KL stays within 10% of the target."""
    return next((i for i in range(len(errors)) if all(abs(e) < tol for e in errors[i:])), None)


def sign_flips(errors: list[float], dead: float = 0.01) -> int:
    signs = [e > 0 for e in errors if abs(e) > dead]
    return sum(a != b for a, b in itertools.pairwise(signs))


def test_registered_and_built_from_config_keys() -> None:
    ctrl = build_kl_controller("pid", kl_coef=0.01, target_kl=0.02, horizon=10000, kp=0.3, ki=None)
    assert isinstance(ctrl, PIDKLController)
    assert (ctrl.value, ctrl.target_kl, ctrl.kp, ctrl.ki, ctrl.kd) == (0.01, 0.02, 0.3, 0.1, 0.0)  # ki=None: default


def test_single_steps_by_hand() -> None:
    ctrl = PIDKLController(0.1, 0.01, kp=0.5, ki=0.1, kl_coef_min=1e-6)
    ctrl.update(0.01 * math.e, 64)  # e = 1, I = 1 -> log beta = log 0.1 + 0.5 + 0.1
    assert math.isclose(ctrl.value, 0.1 * math.exp(0.6), rel_tol=1e-12)
    ctrl.update(0.01, 64)  # e = 0, I = 1 -> log 0.1 + 0.1
    assert math.isclose(ctrl.value, 0.1 * math.exp(0.1), rel_tol=1e-12)
    ctrl.update(1e9, 64)  # e clipped to 2, I = 3 -> log 0.1 + 1.0 + 0.3
    assert math.isclose(ctrl.value, 0.1 * math.exp(1.3), rel_tol=1e-12)
    ctrl.update(-0.5, 64)  # negative k1 estimate: e = -2, I = 1 -> log 0.1 - 1.0 + 0.1
    assert math.isclose(ctrl.value, 0.1 * math.exp(-0.9), rel_tol=1e-12)


def test_derivative_term_by_hand() -> None:
    ctrl = PIDKLController(0.1, 0.01, kp=0.0, ki=0.0, kd=1.0, kl_coef_min=1e-6)
    ctrl.update(0.01, 1)  # first tick: no derivative
    assert ctrl.value == pytest.approx(0.1)
    ctrl.update(0.01 * math.e, 1)  # D = 1 - 0
    assert ctrl.value == pytest.approx(0.1 * math.e)
    ctrl.target_kl = 0.01 * math.e  # retarget: no derivative kick
    ctrl.update(0.01 * math.e, 1)  # e = 0 and last error re-expressed as 0: D = 0
    assert ctrl.value == pytest.approx(0.1)


def test_ignores_non_finite_kl_and_empty_batches() -> None:
    ctrl = PIDKLController(0.1, 0.01)
    for bad in (float("nan"), float("inf"), float("-inf")):
        ctrl.update(bad, 10)
    ctrl.update(1.0, 0)
    assert ctrl.value == 0.1 and ctrl.integral == 0.0
    with pytest.raises(ValueError, match="n_steps"):
        ctrl.update(1.0, -1)


def test_floor_is_the_initial_coefficient_and_does_not_wind_up() -> None:
    ctrl = PIDKLController(0.05, 0.01)
    for _ in range(100):  # first steps: the policy is the reference, KL ~ 0
        ctrl.update(0.0, 64)
    assert ctrl.value == 0.05 and ctrl.integral == 0.0
    fresh = PIDKLController(0.05, 0.01)
    ctrl.update(0.02, 64)
    fresh.update(0.02, 64)
    assert ctrl.value == fresh.value > 0.05  # reacts at once: nothing to unwind


def test_bounds_and_anti_windup_at_the_top() -> None:
    ctrl = PIDKLController(1.0, 0.01, kl_coef_min=1e-6)
    for _ in range(500):
        ctrl.update(1e6, 64)
    assert ctrl.value == PIDKLController.MAX_VALUE
    assert abs(ctrl.integral) <= ctrl.integral_limit
    wound = ctrl.integral
    ctrl.update(1e6, 64)
    assert ctrl.integral == wound  # saturated: no further integration
    for _ in range(500):
        ctrl.update(1e-12, 64)
    assert ctrl.value == pytest.approx(1e-6)
    assert math.isfinite(ctrl.value) and ctrl.value >= PIDKLController.MIN_VALUE


@pytest.mark.parametrize("alpha", [1.0, 0.3, 0.1])
@pytest.mark.parametrize(("beta0", "floor"), [(0.001, None), (10.0, 1e-6)])
def test_settles_on_kl_over_beta_plant(alpha: float, beta0: float, floor: float | None) -> None:
    """Starting 100x off (KL 100x or 1/100 of the target): within 10% of the target in <= 60 ticks,
    overshoot on the far side <= 12% (0.12 in log), and no oscillation: no crossing of the target at
    all, except one bounded overshoot on the slowest plant."""
    errors, betas = simulate(PIDKLController(beta0, TARGET, kl_coef_min=floor), alpha, 150)
    settle = settling_step(errors)
    assert settle is not None and settle <= 60, settle
    start_sign = 1.0 if errors[0] > 0 else -1.0
    assert max(-start_sign * e for e in errors) <= 0.12
    assert sign_flips(errors) <= (0 if alpha >= 0.3 else 1)
    assert betas[-1] == pytest.approx(BETA_STAR, rel=0.02)


@pytest.mark.parametrize("seed", range(4))
def test_noisy_plant_tracks_the_target(seed: int) -> None:
    """KL measured with 20% log-normal noise, lagged plant: after 80 ticks the 10-tick mean of the
    true KL stays within 15% of the target and beta within a factor 1.6 of its equilibrium."""
    errors, betas = simulate(PIDKLController(0.001, TARGET), alpha=0.3, n=200, noise=0.2, seed=seed)
    rolling = [statistics.fmean(errors[i : i + 10]) for i in range(80, 190)]
    assert max(abs(r) for r in rolling) < math.log(1.15)
    assert abs(statistics.fmean(errors[80:])) < 0.05  # unbiased
    assert max(abs(math.log(b / BETA_STAR)) for b in betas[80:]) < math.log(1.6)


def test_constraint_mode_leaves_a_satisfied_constraint_alone() -> None:
    errors, betas = simulate(PIDKLController(1.0, TARGET), alpha=0.3, n=50)  # KL = target / 10
    assert set(betas) == {1.0}
    assert all(e < 0 for e in errors)


def test_assignment_is_bumpless_and_moves_the_floor() -> None:
    ctrl = PIDKLController(0.001, TARGET)
    simulate(ctrl, alpha=0.3, n=120)
    settled = ctrl.value
    ctrl.value = 2 * settled  # the guard's raise_kl_coef
    assert ctrl.value == 2 * settled and ctrl.kl_coef_min == 2 * settled
    ctrl.update(TARGET, 64)  # on target: no move
    assert ctrl.value == pytest.approx(2 * settled)
    ctrl.update(TARGET / 10, 64)  # below target: held at the new floor, not pulled back
    assert ctrl.value == pytest.approx(2 * settled)
    fixed_floor = PIDKLController(0.001, TARGET, kl_coef_min=1e-4)
    fixed_floor.value = 0.5
    assert fixed_floor.kl_coef_min == 1e-4
    with pytest.raises(ValueError, match="value"):
        ctrl.value = 0.0


def test_retarget_settles_again() -> None:
    ctrl = PIDKLController(0.001, TARGET)
    simulate(ctrl, alpha=0.3, n=120)
    ctrl.target_kl = TARGET / 2  # the guard's lower_target_kl
    errors, betas = [], []
    y = math.log(TARGET)
    for _ in range(80):
        errors.append(y - math.log(TARGET / 2))
        betas.append(ctrl.value)
        ctrl.update(math.exp(y), 64)
        y = 0.7 * y + 0.3 * math.log(C / ctrl.value)
    assert settling_step(errors) <= 40
    assert betas[-1] == pytest.approx(2 * BETA_STAR, rel=0.02)
    with pytest.raises(ValueError, match="target_kl"):
        ctrl.target_kl = 0.0


@pytest.mark.parametrize(
    "kwargs",
    [
        {"kp": -1.0},
        {"ki": float("nan")},
        {"kd": -0.1},
        {"error_clip": 0.0},
        {"integral_limit": -1.0},
        {"kl_coef_min": 0.0},
    ],
)
def test_rejects_bad_args(kwargs: dict[str, float]) -> None:
    with pytest.raises(ValueError, match=next(iter(kwargs))):
        PIDKLController(0.1, 0.01, **kwargs)
    with pytest.raises(ValueError, match="init_kl_coef"):
        PIDKLController(0.0, 0.01)


def test_state_round_trip_continues_identically() -> None:
    ctrl = PIDKLController(0.001, TARGET, kd=0.2)
    simulate(ctrl, alpha=0.3, n=30, noise=0.2, seed=1)
    state = json.loads(json.dumps(ctrl.state_dict()))
    assert state["type"] == "pid"
    other = PIDKLController(1.0, 1.0)
    other.load_state_dict(state)
    assert other.state_dict() == ctrl.state_dict()
    a, _ = simulate(ctrl, alpha=0.3, n=30, noise=0.2, seed=2)
    b, _ = simulate(other, alpha=0.3, n=30, noise=0.2, seed=2)
    assert a == b and ctrl.value == other.value
    with pytest.raises(ValueError, match="adaptive"):
        other.load_state_dict(AdaptiveKLController(0.1, 0.1, 10).state_dict())


@settings(max_examples=60, deadline=None)
@given(st.lists(st.floats(allow_nan=True, allow_infinity=True, width=64), max_size=40))
def test_value_stays_finite_and_in_bounds(kls: list[float]) -> None:
    ctrl = PIDKLController(0.01, 0.01, kl_coef_min=1e-6)
    for kl in kls:
        ctrl.update(kl, 8)
        assert PIDKLController.MIN_VALUE <= ctrl.value <= PIDKLController.MAX_VALUE
        assert abs(ctrl.integral) <= ctrl.integral_limit
