"""verl's DAPO options and the estimators with other baselines, in the trainer: overlong shaping, dynamic sampling,
remax's greedy baseline, optimal_token_baseline's sum of squared probabilities, GDPO's per-key rewards."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from klguard.algo.reward_shaping import informative_groups, overlong_penalty
from klguard.commands.cli import main
from klguard.ppo import sampled, trainer

ONE_STEP = ("trainer.total_training_steps=1", "trainer.test_freq=-1", "trainer.val_before_train=false",
            "trainer.save_freq=-1")
BUFFER = "+reward_model.reward_kwargs.overlong_buffer_cfg"


def last_step(overrides: list[str]) -> dict:
    run = Path(next(a for a in overrides if a.startswith("trainer.default_local_dir=")).split("=", 1)[1])
    return json.loads((run / "metrics.jsonl").read_text().splitlines()[-1])


def test_overlong_penalty_by_hand():
    # max 32, buffer 8: free up to 24 tokens, then -1/8 per token times the factor 0.5
    got = overlong_penalty(torch.tensor([10, 24, 25, 28, 32]), 32, 8, 0.5)
    assert torch.allclose(got, torch.tensor([0.0, 0.0, -0.0625, -0.25, -0.5]))


def test_informative_groups_keep_groups_that_score_apart_and_groups_of_one():
    values = torch.tensor([1.0, 1.0, 0.0, 1.0, 0.5, 0.5, 0.5, 2.0])
    groups = torch.tensor([0, 0, 1, 1, 2, 2, 2, 3])
    assert informative_groups(values, groups).tolist() == [False, True, False, True]


def spy_advantages(monkeypatch) -> list[dict]:
    calls = []
    real = trainer.compute_advantage

    def spy(name, **kwargs):
        calls.append({"name": name, **kwargs})
        return real(name, **kwargs)

    monkeypatch.setattr(trainer, "compute_advantage", spy)
    return calls


def test_overlong_shaping_lowers_the_optimised_score(fast_overrides):
    assert main(["train", *fast_overrides, *ONE_STEP, f"{BUFFER}.enable=true", f"{BUFFER}.len=12",
                 f"{BUFFER}.penalty_factor=1.0", f"{BUFFER}.log=true"]) == 0
    step = last_step(fast_overrides)
    assert step["reward/overlong_penalty"] < 0 < step["reward/overlong"]  # the demo's run-ons pass 16 - 12 tokens
    # what PPO optimises is the raw proxy plus the penalty
    assert step["critic/score/mean"] == pytest.approx(step["hacking/proxy_score"] + step["reward/overlong_penalty"],
                                                      abs=1e-6)


def test_dynamic_sampling_trains_only_groups_that_score_apart(fast_overrides, monkeypatch):
    calls = spy_advantages(monkeypatch)
    assert main(["train", *fast_overrides, *ONE_STEP, "algorithm.adv_estimator=grpo", "actor_rollout_ref.rollout.n=2",
                 "algorithm.use_kl_in_reward=false", "algorithm.filter_groups.enable=true",
                 "algorithm.filter_groups.metric=reward"]) == 0
    (call,) = calls
    scores, groups = call["token_level_rewards"].sum(-1), call["group_index"]
    assert len(scores) == 16 * 2 and groups.tolist() == [i // 2 for i in range(32)]
    assert all(scores[2 * g] != scores[2 * g + 1] for g in range(16))
    step = last_step(fast_overrides)
    assert step["filter_groups/num_gen_batches"] >= 1 and "filter_groups/filtered_groups" in step


def test_dynamic_sampling_stops_in_one_line_at_its_cap(fast_overrides, monkeypatch, capsys):
    monkeypatch.setattr(sampled, "informative_groups", lambda values, groups: torch.zeros(int(groups.max()) + 1,
                                                                                            dtype=torch.bool))
    assert main(["train", *fast_overrides, *ONE_STEP, "algorithm.adv_estimator=grpo", "actor_rollout_ref.rollout.n=2",
                 "algorithm.filter_groups.enable=true", "algorithm.filter_groups.max_num_gen_batches=2"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("klguard: error: algorithm.filter_groups.max_num_gen_batches=2: 2 generation batches")


def test_remax_subtracts_the_greedy_responses_score(fast_overrides, monkeypatch):
    calls = spy_advantages(monkeypatch)
    baselines = []
    real = sampled.greedy_baselines

    def spy(*args):
        baselines.append(real(*args))
        return baselines[-1]

    monkeypatch.setattr(trainer, "greedy_baselines", spy)
    assert main(["train", *fast_overrides, *ONE_STEP, "algorithm.adv_estimator=remax",
                 "actor_rollout_ref.rollout.n=1"]) == 0
    (call,) = calls
    assert torch.equal(call["reward_baselines"], baselines[0].to(call["reward_baselines"]))
    assert float(baselines[0].min()) > 0  # the proxy of a greedy answer: format, answer, length bonus


def test_optimal_token_baseline_gets_the_actors_sum_of_squared_probabilities(fast_overrides, monkeypatch):
    calls = spy_advantages(monkeypatch)
    assert main(["train", *fast_overrides, *ONE_STEP, "algorithm.adv_estimator=optimal_token_baseline",
                 "actor_rollout_ref.rollout.n=2"]) == 0
    (call,) = calls
    spp, mask = call["sum_pi_squared"], call["response_mask"]
    valid = spp[mask != 0]
    assert bool(((valid > 0) & (valid <= 1 + 1e-5)).all()) and bool((spp[mask == 0] == 0).all())
    # the sampled token's own probability squared is part of the sum
    assert bool((valid >= call["old_log_probs"][mask != 0].exp() ** 2 - 1e-4).all())


GDPO_REWARD = '''
def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    fmt = float(solution_str.strip().startswith("####"))
    acc = float(solution_str.strip().split(" ")[-1] == ground_truth)
    return {"score": acc, "fmt": fmt, "acc": acc}
'''


def test_gdpo_reads_each_key_of_the_reward_functions_dicts(fast_overrides, monkeypatch, tmp_path, capsys):
    reward = tmp_path / "reward.py"
    reward.write_text(GDPO_REWARD)
    calls = spy_advantages(monkeypatch)
    common = [*fast_overrides, *ONE_STEP, "algorithm.adv_estimator=gdpo", "actor_rollout_ref.rollout.n=2",
              f"custom_reward_function.path={reward}"]
    assert main(["train", *common, "algorithm.gdpo_reward_keys=[fmt,acc]", "algorithm.gdpo_reward_weights=[1,2]"]) == 0
    (call,) = calls
    fmt, acc = call["reward_components"]
    assert len(fmt) == len(acc) == 32 and set(fmt.tolist()) <= {0.0, 1.0} and call["reward_weights"] == [1, 2]
    # each key the function returns is a per-function score, as the guard's proxy_correctness reads them
    step = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()][-1]
    assert step["critic/score/fmt/mean"] == pytest.approx(fmt.float().mean().item(), abs=1e-6)
    assert step["critic/score/acc/mean"] == pytest.approx(acc.float().mean().item(), abs=1e-6)
    assert main(["train", *common, "algorithm.gdpo_reward_keys=[fmt,length]",
                 f"trainer.default_local_dir={tmp_path / 'second'}"]) == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert "algorithm.gdpo_reward_keys" in err and "'length'" in err
