"""PAR shaping (reward_model.shaping=par): sigmoid(score - the reference response's score)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import torch

from klguard.commands.cli import main
from klguard.ppo import sampled, scoring, trainer
from klguard.ppo.scoring import par_shaped


def test_par_on_hand_computed_values():
    shaped = par_shaped(torch.tensor([0.0, 1.0, -2.0, 30.0]), torch.tensor([0.0, 0.0, 1.0, 0.0]))
    expected = [0.5, 1 / (1 + math.exp(-1)), 1 / (1 + math.exp(3)), 1.0]
    assert torch.allclose(shaped, torch.tensor(expected), atol=1e-7, rtol=0)  # bounded: a huge score earns ~1


def test_a_par_run_optimises_the_shaped_score(fast_overrides, monkeypatch):
    seen = []

    def spy(ref, *args, **kwargs):
        assert ref is not None  # the reference policy is loaded for PAR even with the KL off
        r_ref = scoring.reference_scores(ref, *args, **kwargs)
        seen.append(r_ref)
        return r_ref

    monkeypatch.setattr(trainer, "reference_scores", spy)
    raw = []
    real_score = sampled.score_rollout

    def score_spy(*args, **kwargs):
        reward = real_score(*args, **kwargs)
        raw.append(reward.scores)
        return reward

    monkeypatch.setattr(sampled, "score_rollout", score_spy)
    assert main(["train", *fast_overrides, "reward_model.shaping=par", "algorithm.use_kl_in_reward=false",
                 "trainer.total_training_steps=1", "trainer.test_freq=-1", "trainer.val_before_train=false"]) == 0
    run = Path(next(a for a in fast_overrides if a.startswith("trainer.default_local_dir=")).split("=", 1)[1])
    step = json.loads((run / "metrics.jsonl").read_text().splitlines()[-1])
    assert len(seen) == 1 and len(raw) == 1
    expected = torch.sigmoid(raw[0] - seen[0])
    assert abs(step["critic/score/mean"] - expected.mean().item()) < 1e-6  # what PPO optimises
    assert abs(step["hacking/proxy_score"] - raw[0].mean().item()) < 1e-6  # the raw proxy stays on record
    assert step["critic/score/min"] > 0 and step["critic/score/max"] < 1


def test_par_is_refused_under_tensor_parallelism(capsys):
    assert main(["train", "reward_model.shaping=par", "actor_rollout_ref.actor.strategy=fsdp_turbo",
                 "critic.strategy=fsdp_turbo",
                 "actor_rollout_ref.actor.fsdp_config.turbo_config.distributed.tensor_parallel_size=2"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("klguard: error: reward_model.shaping='par' is not supported with "
                                               "tensor parallelism"), err
