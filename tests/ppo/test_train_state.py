"""TrainState: its plain state round-trips through state_dict/load_state_dict (as a checkpoint's JSON does), and the
guard's lr scale applies on top of the schedule."""

from __future__ import annotations

import json

import torch

from klguard.algo.kl import build_kl_controller
from klguard.config.schema import OptimConfig
from klguard.data.sampler import PromptSampler
from klguard.ppo.setup import build_optimizer
from klguard.ppo.state import TrainState


def _state(lr: float = 0.1) -> TrainState:
    actor = torch.nn.Linear(3, 2)
    optim, sched = build_optimizer(actor, OptimConfig(lr=lr, lr_warmup_steps=4), total_steps=10)
    return TrainState(actor=actor, actor_optim=optim, actor_sched=sched,
                      kl_ctrl=build_kl_controller("adaptive", kl_coef=0.2, target_kl=0.01, horizon=100),
                      sampler=PromptSampler(16, 4, shuffle=True, seed=3))


def test_state_dict_round_trips_through_json():
    state = _state()
    for _ in range(3):
        state.sampler.next_batch()
        state.actor_sched.step()
        state.kl_ctrl.update(0.05, n_steps=8)
    state.step = 3
    saved = json.loads(json.dumps(state.state_dict()))
    fresh = _state()
    fresh.load_state_dict(saved)
    assert fresh.state_dict() == state.state_dict() and fresh.step == 3
    assert fresh.sampler.next_batch() == state.sampler.next_batch()  # the data position goes on where it was
    assert fresh.kl_ctrl.value == state.kl_ctrl.value != 0.2  # the controller moved and was restored
    fresh.apply_lr_scale(0.25)  # warm-up step 3 of 4: lr 0.1 * 4/4, times the guard's 0.25
    assert fresh.actor_optim.param_groups[0]["lr"] == 0.1 * 1.0 * 0.25


def test_lr_scale_applies_on_top_of_the_schedule():
    state = _state(lr=0.2)
    state.actor_sched.step()  # warm-up step 1 of 4: 0.2 * 2/4
    state.apply_lr_scale(0.5)
    assert state.actor_optim.param_groups[0]["lr"] == 0.2 * 0.5 * 0.5
    assert [name for name, _ in state.models()] == ["actor"]
