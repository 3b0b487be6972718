"""hacking/ref_low_prob_share and hacking/ref_nll on hand-made reference log-probs; the advice rules' inputs
(critic/score/frac_zero_std, actor/policy_ratio)."""

from __future__ import annotations

import json
import math

import pytest
import torch

from klguard.commands.cli import main
from klguard.ppo.metrics import group_metrics, support_metrics


def test_support_metrics_count_only_response_tokens():
    logp = torch.log(torch.tensor([[0.5, 0.005, 0.9, 1e-9],    # one of 3 tokens under 0.01; the 4th is padding
                                   [0.02, 0.011, 0.0, 0.0]]))  # none under 0.01 (0.011 is just above)
    mask = torch.tensor([[1, 1, 1, 0], [1, 1, 0, 0]])
    out = support_metrics(logp, mask, prob_floor=0.01)
    assert abs(out["hacking/ref_low_prob_share"] - 1 / 5) < 1e-7  # a float32 mean
    nll = -(math.log(0.5) + math.log(0.005) + math.log(0.9) + math.log(0.02) + math.log(0.011)) / 5
    assert abs(out["hacking/ref_nll"] - nll) < 1e-6 * nll  # float32 rounding of a mean of 5 at this scale
    assert abs(support_metrics(logp, mask, prob_floor=0.03)["hacking/ref_low_prob_share"] - 3 / 5) < 1e-7


def test_frac_zero_std_counts_groups_of_two_or_more_that_scored_alike():
    scores = torch.tensor([1.0, 1.0, 0.0, 1.0, 0.5, 0.5, 0.2])  # groups 0: alike, 1: apart, 2: alike, 3: alone
    groups = torch.tensor([0, 0, 1, 1, 2, 2, 3])
    assert group_metrics(scores, groups) == {"critic/score/frac_zero_std": pytest.approx(2 / 3)}
    assert group_metrics(scores, torch.arange(7)) == {}  # rollout.n 1: no group to judge


def test_policy_ratio_is_logged_beside_ppo_kl(fast_overrides, tmp_path):
    """actor/policy_ratio: the update's mean pi/pi_old over response tokens; one epoch on fresh samples starts at
    exactly the sampling policy, so it stays near 1 (the guard's policy_ratio rule reads it)."""
    assert main(["train", *fast_overrides, "trainer.total_training_steps=1", "trainer.test_freq=-1",
                 "trainer.val_before_train=false", "trainer.save_freq=-1"]) == 0
    step = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()][-1]
    assert 0.9 < step["actor/policy_ratio"] < 1.1 and "actor/ppo_kl" in step
