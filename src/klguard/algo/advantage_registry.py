"""Advantage estimators by name, each declaring the inputs it needs (verl's `register_adv_est` is the model).

An estimator takes ``(token_level_rewards [B, T], response_mask [B, T])`` and keyword arguments: the algorithm's
scalars (``gamma``, ``lam``, ``norm_adv_by_std_in_grpo``), which every estimator is given and may ignore, and the
inputs its registration declares, from ADV_INPUTS; it ignores any other (``**_``). It returns
``(advantages, returns)``, both ``[B, T]``. A new one is a function decorated with
``@register_adv_est("name", inputs=(...))`` in klguard.algo.advantage or klguard.algo.advantage_baselines: the
config's ``algorithm.adv_estimator`` choices are the registered names, and the trainer builds the declared inputs.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch

from klguard.algo.registry import Registry

AdvantageFn = Callable[..., tuple[torch.Tensor, torch.Tensor]]

# Every input an estimator may declare, and what it is; the trainer builds each one an estimator declares.
ADV_INPUTS: dict[str, str] = {
    "values": "a critic",
    "group_index": "one group key per sequence",
    "reward_baselines": "one greedy response's score per sequence",
    "old_log_probs": "the rollout's log-probs of the sampled tokens, [B, T]",
    "sum_pi_squared": "the actor's sum of squared probabilities over the vocabulary, [B, T]",
    "reward_components": "one [B] score per algorithm.gdpo_reward_keys entry",
    "reward_weights": "one weight per reward component",
}
# declared inputs that may be None, the estimator saying what it does then (gdpo: one component, weights 1 each)
OPTIONAL_INPUTS = ("reward_components", "reward_weights")

_ADV_ESTIMATORS: Registry[AdvantageFn] = Registry("adv_estimator", known=ADV_INPUTS)
ADV_ESTIMATORS = _ADV_ESTIMATORS.entries  # name -> estimator, in registration order
# estimators that compare a prompt's responses with each other (a group of one falls back as verl's: see docs/verl.md)
GROUP_ESTIMATORS = _ADV_ESTIMATORS.declaring("group_index")


def register_adv_est(name: str, inputs: Sequence[str] = ()) -> Callable[[AdvantageFn], AdvantageFn]:
    """Decorator: make `fn` the estimator called `name`, given the ADV_INPUTS named in `inputs`."""
    return _ADV_ESTIMATORS.register(name, inputs)


def adv_estimator_names() -> tuple[str, ...]:
    return _ADV_ESTIMATORS.names()


def get_adv_estimator(name: str) -> AdvantageFn:
    return _ADV_ESTIMATORS.get(name)


def adv_estimator_inputs(name: str) -> tuple[str, ...]:
    """The ADV_INPUTS the estimator `name` declared: what a caller builds and passes to it."""
    return _ADV_ESTIMATORS.inputs(name)


def unregister_adv_est(name: str) -> None:
    """Remove an estimator (a test's throwaway one)."""
    _ADV_ESTIMATORS.unregister(name)


def compute_advantage(
    name: str, token_level_rewards: torch.Tensor, response_mask: torch.Tensor, **kwargs: Any
) -> tuple[torch.Tensor, torch.Tensor]:
    """Call the estimator `name` with the keyword arguments, refusing a declared, not optional input that is None."""
    fn = get_adv_estimator(name)
    for needed in adv_estimator_inputs(name):
        if kwargs.get(needed) is None and needed not in OPTIONAL_INPUTS:
            raise ValueError(f"adv_estimator {name!r} needs {needed} ({ADV_INPUTS[needed]})")
    return fn(token_level_rewards, response_mask, **kwargs)
