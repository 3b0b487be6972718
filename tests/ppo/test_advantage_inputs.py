"""The trainer asks the estimator registry which inputs the configured estimator declared and builds those: a
throwaway estimator registered here gets exactly its inputs, and every input an estimator may declare has a builder."""

from __future__ import annotations

from collections.abc import Iterator
from types import SimpleNamespace

import pytest
import torch

from klguard.algo import register_adv_est
from klguard.algo.advantage_registry import ADV_INPUTS, unregister_adv_est
from klguard.ppo import trainer
from klguard.ppo.trainer import PPOTrainer

SCALARS = {"gamma": 1.0, "lam": 0.95, "norm_adv_by_std_in_grpo": True}
ROWS = 4


@pytest.fixture
def declare(monkeypatch) -> Iterator:
    """`declare(*inputs)` registers the estimator `throwaway` needing `inputs` and returns the list of the keyword
    arguments of its calls; the estimator leaves with the test. The costly builders (a greedy rollout, a forward)
    return markers here."""
    monkeypatch.setattr(trainer, "greedy_baselines", lambda _trainer, prompts: torch.full((ROWS,), 7.0))
    monkeypatch.setattr(trainer, "sum_pi_squared", lambda _trainer, prompts, out: torch.full((ROWS, 3), 0.5))
    calls: list[dict] = []

    def add(*inputs: str) -> list[dict]:
        @register_adv_est("throwaway", inputs=inputs)
        def throwaway(token_level_rewards, response_mask, **kwargs):
            calls.append(kwargs)
            return token_level_rewards, token_level_rewards

        return calls

    yield add
    unregister_adv_est("throwaway")


def advantages(values: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """PPOTrainer._advantages on one step's stand-ins, algorithm.adv_estimator=throwaway."""
    algorithm = SimpleNamespace(adv_estimator="throwaway", gdpo_reward_keys=["fmt"], gdpo_reward_weights=[2.0],
                                **SCALARS)
    fake = SimpleNamespace(cfg=SimpleNamespace(algorithm=algorithm))
    sampled = SimpleNamespace(prompts=SimpleNamespace(group_index=torch.tensor([0, 0, 1, 1])),
                              out=SimpleNamespace(old_logprobs=torch.full((ROWS, 3), -1.0, dtype=torch.float64)),
                              reward=SimpleNamespace(extra={"fmt": torch.ones(ROWS)}))
    rewards = torch.ones(ROWS, 3)
    return PPOTrainer._advantages(fake, sampled, rewards, torch.ones(ROWS, 3), values)


def test_the_trainer_builds_only_what_the_estimator_declared(declare):
    calls = declare("group_index")
    advantages(values=torch.zeros(ROWS, 3))
    (call,) = calls
    assert call.keys() == {"group_index", *SCALARS}  # no values, no greedy rollout: not declared
    assert call["group_index"].tolist() == [0, 0, 1, 1]


def test_the_trainer_builds_every_input_an_estimator_may_declare(declare):
    calls = declare(*ADV_INPUTS)
    values = torch.zeros(ROWS, 3)
    advantages(values)
    (call,) = calls
    assert call.keys() == {*ADV_INPUTS, *SCALARS}
    assert call["values"] is values and call["reward_weights"] == [2.0]
    assert call["reward_baselines"].tolist() == [7.0] * ROWS and call["sum_pi_squared"].unique().tolist() == [0.5]
    assert call["old_log_probs"].dtype == torch.float32 and [c.tolist() for c in call["reward_components"]] == \
        [[1.0] * ROWS]


def test_a_declared_input_the_step_lacks_is_refused(declare):
    declare("values")
    with pytest.raises(ValueError, match=r"adv_estimator 'throwaway' needs values \(a critic\)"):
        advantages(values=None)
