"""The real-model tasks in TRL (klguard.builtin.trl_real_task, examples/trl/grpo_real_model.py): the reward functions
score as klguard's RewardManager does, and a two-step GRPOTrainer run on SmolLM2 with the guard (no gold) trains,
logs gold beside the proxy, and leaves a summary."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

from extras import import_extra

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "trl" / "grpo_real_model.py"
TINY = ["data.train_batch_size=2", "actor_rollout_ref.actor.ppo_mini_batch_size=2", "actor_rollout_ref.rollout.n=2",
        "data.max_response_length=8"]


def _example():
    spec = importlib.util.spec_from_file_location("grpo_real_model", EXAMPLE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_reward_functions_score_like_the_task(smollm2):
    import_extra("trl", "trl")
    from klguard.builtin import constraints
    from klguard.builtin.trl_real_task import TaskRewards, task_prompts

    rewards = TaskRewards("constraints", TINY, log=lambda *_: None)
    row = next(r for r in task_prompts("constraints", rewards.tokenizer)
               if {k for k, _ in constraints.decode_truth(r["ground_truth"])[1]} == {"uses", "exclaims"})
    words, cons = constraints.decode_truth(row["ground_truth"])
    word = dict(cons)["uses"]
    good = f"This {' '.join(words)} is {word} and it works well for me every day!"
    hack = f"{word.capitalize()}!"  # both constraints met, no item, no sentence: gold 0, verifier 1
    texts = [good, hack]
    kwargs = {"completion_ids": [[1] * 12, [1] * 3], "ground_truth": [row["ground_truth"]] * 2,
              "data_source": [row["data_source"]] * 2, "messages": [row["messages"]] * 2}
    proxy, gold, hacking = rewards.functions()
    assert [f.__name__ for f in (proxy, gold, hacking)] == ["proxy", "gold", "hacking"]  # TRL logs by name
    assert gold(texts, **kwargs) == [constraints.gold_score(t, row["ground_truth"]) for t in texts] == [1.0, 0.0]
    assert proxy(texts, **kwargs) == [1.0, 1.0]
    assert hacking(texts, **kwargs) == [0.0, 1.0]
    assert json.loads(row["messages"])[-1]["role"] == "user"
    assert row["prompt"].endswith("assistant\n")  # the chat template applied, the generation prompt open


def test_two_guarded_grpo_steps_on_smollm2_without_gold(smollm2, tmp_path):
    import_extra("trl", "trl")
    example = _example()
    from klguard.builtin.trl_real_task import TaskRewards

    rewards = TaskRewards("constraints", TINY, log=lambda *_: None)
    summary = example.run(tmp_path / "guarded", rewards, seed=1, steps=2, lr=1e-5, guarded=True, overrides=[])
    assert summary["steps_trained"] == 2 and summary["guarded"]
    assert 0.0 <= summary["gold"] <= 1.0 and 0.0 <= summary["hacking_rate"] <= 1.0
    assert 0 < summary["response_length"] <= 8
    state = json.loads((tmp_path / "guarded" / "trainer_state.json").read_text())
    logged = [h for h in state["log_history"] if "rewards/gold/mean" in h]
    assert len(logged) == 2 and all("rewards/proxy/mean" in h for h in logged)
    assert all(h["beta"] == pytest.approx(0.001) for h in logged)  # the guard's log of the coefficient it holds
    assert not any(k.startswith("guard/gold") for h in logged for k in h)  # no gold was given to the guard


@pytest.mark.parametrize("task", ["arith", "nope"])
def test_a_task_without_a_real_model_is_one_line(task):
    from klguard.builtin.trl_real_task import TaskRewards
    from klguard.errors import UserError

    with pytest.raises(UserError, match="the real-model tasks are reviews, constraints"):
        TaskRewards(task)
