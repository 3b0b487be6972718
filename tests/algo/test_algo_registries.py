"""One registry style in algo/: an advantage estimator or a KL controller is one decorated function whose registration
declares the inputs it needs; callers ask the registry for them, and the config's choices are the registered names."""

from __future__ import annotations

from collections.abc import Iterator
from typing import get_args

import pytest
import torch

from klguard.algo import (
    ADV_ESTIMATORS,
    GROUP_ESTIMATORS,
    KL_CONTROLLERS,
    FixedKLController,
    adv_estimator_inputs,
    build_kl_controller,
    compute_advantage,
    kl_controller_inputs,
    register_adv_est,
    register_kl_controller,
)
from klguard.algo.advantage import AdvEstimator
from klguard.algo.advantage_registry import ADV_INPUTS, adv_estimator_names, unregister_adv_est
from klguard.algo.kl import KLCtrlType, unregister_kl_controller
from klguard.config import Config
from klguard.fields import choice_fields

REWARDS = torch.tensor([[0.0, 1.0], [0.0, 2.0]])
MASK = torch.ones(2, 2)


@pytest.fixture
def throwaway_estimator() -> Iterator[list[dict]]:
    """An estimator named `throwaway`, declaring two inputs, registered for one test; it records its calls."""
    calls: list[dict] = []

    @register_adv_est("throwaway", inputs=("group_index", "reward_baselines"))
    def throwaway(token_level_rewards, response_mask, **kwargs):
        calls.append(kwargs)
        return token_level_rewards * response_mask, token_level_rewards * response_mask

    yield calls
    unregister_adv_est("throwaway")


def test_a_decorated_estimator_declares_its_inputs_to_the_callers_query(throwaway_estimator):
    assert adv_estimator_inputs("throwaway") == ("group_index", "reward_baselines")
    assert "throwaway" in ADV_ESTIMATORS and adv_estimator_names()[-1] == "throwaway"
    assert "throwaway" in GROUP_ESTIMATORS  # it declares group_index: it compares a prompt's responses
    compute_advantage("throwaway", REWARDS, MASK, group_index=[0, 0], reward_baselines=torch.zeros(2), gamma=1.0)
    assert set(throwaway_estimator[0]) == {"group_index", "reward_baselines", "gamma"}
    with pytest.raises(ValueError, match=r"'throwaway' needs reward_baselines \(one greedy response's score"):
        compute_advantage("throwaway", REWARDS, MASK, group_index=[0, 0])


def test_the_throwaway_estimator_leaves_with_its_test():
    assert "throwaway" not in ADV_ESTIMATORS and "throwaway" not in GROUP_ESTIMATORS
    with pytest.raises(ValueError, match=r"unknown adv_estimator 'throwaway'; valid: gae, grpo"):
        adv_estimator_inputs("throwaway")


def test_the_builtin_estimators_declare_what_the_trainer_built_for_them_by_name():
    assert {name: adv_estimator_inputs(name) for name in ADV_ESTIMATORS} == {
        "gae": ("values",),
        "grpo": ("group_index",),
        "rloo": ("group_index",),
        "reinforce_plus_plus": (),
        "reinforce_plus_plus_baseline": ("group_index",),
        "remax": ("reward_baselines",),
        "gpg": ("group_index",),
        "optimal_token_baseline": ("group_index", "old_log_probs", "sum_pi_squared"),
        "gdpo": ("group_index", "reward_components", "reward_weights"),
    }


def test_a_registration_is_refused_for_a_taken_name_or_an_unknown_input():
    with pytest.raises(ValueError, match="adv_estimator 'grpo' is already registered"):
        register_adv_est("grpo", inputs=("group_index",))(lambda *args, **kwargs: None)
    with pytest.raises(ValueError, match=r"declares unknown inputs \['critic_values'\]; known: values, group_index"):
        register_adv_est("new", inputs=("critic_values",))
    assert "new" not in ADV_ESTIMATORS
    assert set(ADV_INPUTS) == {"values", "group_index", "reward_baselines", "old_log_probs", "sum_pi_squared",
                               "reward_components", "reward_weights"}


@pytest.fixture
def throwaway_controller() -> Iterator[list[dict]]:
    """A KL controller named `throwaway`, declaring two keyword arguments, registered for one test."""
    calls: list[dict] = []

    @register_kl_controller("throwaway", inputs=("kl_coef", "horizon"))
    def build(**kwargs):
        calls.append(kwargs)
        return FixedKLController(kwargs["kl_coef"])

    yield calls
    unregister_kl_controller("throwaway")


def test_a_decorated_controller_declares_its_inputs_and_is_built_from_those_only(throwaway_controller):
    assert kl_controller_inputs("throwaway") == ("kl_coef", "horizon")
    assert "throwaway" in KL_CONTROLLERS
    # the algorithm.kl_ctrl keys, as ppo.setup passes them: the factory gets the two it declared
    ctrl = build_kl_controller(type="throwaway", kl_coef=0.2, horizon=500, target_kl=0.1, kl_unit="token_mean",
                               kp=0.5, ki=0.1, kd=0.0)
    assert ctrl.value == 0.2 and throwaway_controller == [{"kl_coef": 0.2, "horizon": 500}]


def test_the_throwaway_controller_leaves_with_its_test():
    assert "throwaway" not in KL_CONTROLLERS
    with pytest.raises(ValueError, match=r"unknown kl controller type 'throwaway'; valid: fixed, adaptive, pid"):
        kl_controller_inputs("throwaway")


def test_the_builtin_controllers_declare_their_keyword_arguments():
    assert kl_controller_inputs("fixed") == ("kl_coef",)
    assert kl_controller_inputs("adaptive") == ("kl_coef", "target_kl", "horizon")
    assert kl_controller_inputs("pid") == ("kl_coef", "target_kl", "kp", "ki", "kd", "error_clip", "integral_limit",
                                           "kl_coef_min")


def test_the_configs_choices_are_the_registered_names():
    allowed = {path: values for path, _, values in choice_fields(Config)}
    assert allowed["algorithm.adv_estimator"] == tuple(ADV_ESTIMATORS)
    assert allowed["algorithm.kl_ctrl.type"] == tuple(KL_CONTROLLERS)
    assert get_args(AdvEstimator) == adv_estimator_names() and get_args(KLCtrlType) == ("fixed", "adaptive", "pid")
