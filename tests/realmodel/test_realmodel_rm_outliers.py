"""The reward model's last-layer features on the tiny Llama RM: read at the token the score comes from, scores
unchanged; hacking/rm_feature_outlier_share in a PPO run, and a run resumed from a checkpoint (baseline still being
collected, or fitted) logging what the uninterrupted run logs."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import torch
from transformers import AutoConfig

from klguard.commands.cli import main
from klguard.config import load_config
from klguard.ppo.checkpointing import RM_OUTLIERS_FILE
from klguard.reward.ensemble import RewardEnsemble
from klguard.reward.model_rm import ModelReward
from klguard.runtime.checkpoint import load_tensors, write_manifest
from tolerances import float32_tol, forward_terms

METRIC = "hacking/rm_feature_outlier_share"
PROMPTS = [[{"role": "user", "content": "Tom has 3 apples and buys 11 more."}],
           [{"role": "user", "content": "How many apples?"}], [{"role": "user", "content": "Tom has 4 apples."}]]
RESPONSES = ["#### 14", "He has 25 apples now, the answer is 25", ""]


def _config(rm: Path, *overrides: str):
    return load_config(None, ["data.train_files=x.parquet", "data.val_files=y.parquet", "trainer.device=cpu",
                              "reward_model.enable=true", f"reward_model.model.path={rm}", *overrides]).config


def test_features_are_the_hidden_state_the_score_is_read_from(assets):
    cpu = torch.device("cpu")
    batched = ModelReward(_config(assets.rm, "reward_model.micro_batch_size_per_gpu=3"), cpu, assets.rm, user=True)
    scores, features = batched.score(PROMPTS, RESPONSES, features=True)
    assert torch.equal(scores, batched(PROMPTS, RESPONSES))  # asking for the features leaves the scores alone
    hidden = AutoConfig.from_pretrained(assets.rm).hidden_size
    assert features.shape == (3, hidden) and features.dtype == torch.float32
    # the score head applied to the features gives the scores: the score head's rounding (hidden terms)
    head = batched.model.score.weight.float()
    torch.testing.assert_close((features @ head.T)[:, 0], scores, rtol=0, atol=float32_tol(scores, hidden))
    # padded rows (micro-batch 3) against one row at a time: the features of each row's own last token
    single = ModelReward(_config(assets.rm, "reward_model.micro_batch_size_per_gpu=1"), cpu, assets.rm, user=True)
    alone = single.score(PROMPTS, RESPONSES, features=True)[1]
    terms = forward_terms(AutoConfig.from_pretrained(assets.rm))
    torch.testing.assert_close(features, alone, rtol=0, atol=float32_tol(alone, terms))
    # an ensemble gives its first member's features
    ensemble = RewardEnsemble(_config(assets.rm), cpu, [assets.rm, assets.rm], user=True)
    assert torch.equal(ensemble(PROMPTS, RESPONSES, features=True).features, features)  # same padding: equal
    assert ensemble(PROMPTS, RESPONSES).features is None


def _records(run: Path) -> dict[int, dict]:
    return {r["step"]: r for r in map(json.loads, (run / "metrics.jsonl").read_text().splitlines())
            if "critic/score/mean" in r}


def test_the_share_is_logged_after_the_baseline_and_a_resumed_run_logs_the_same(base_overrides, assets, tmp_path,
                                                                                 capsys):
    # 16 rollouts a step, a baseline of 3 steps (48 rollouts of 32 features); checkpoints at steps 2 and 4
    args = [*base_overrides, "reward_model.enable=true", f"reward_model.model.path={assets.rm}",
            "actor_rollout_ref.rollout.n=4", "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=4",
            "guard.baseline_window=3", "trainer.total_training_steps=5", "trainer.save_freq=2"]
    straight = tmp_path / "run"
    assert main(["train", *args]) == 0
    expected = _records(straight)
    assert [s for s in expected if METRIC in expected[s]] == [4, 5]  # not before the baseline is complete
    assert all(0.0 <= expected[s][METRIC] <= 1.0 for s in (4, 5))
    assert all(expected[s]["guard/hack_rm_outlier"] == 0.0 for s in expected)  # no baseline of the share yet
    collecting = load_tensors(straight / "global_step_2" / RM_OUTLIERS_FILE)
    assert collecting["steps"] == 2 and collecting["features"].shape == (32, 32)

    for step in (2, 4):  # resume from a baseline being collected, and from a fitted one
        run = tmp_path / f"resumed-{step}"
        shutil.copytree(straight / f"global_step_{step}", tmp_path / f"ckpt-{step}")
        assert main(["train", *args, f"trainer.default_local_dir={run}", "trainer.resume_mode=resume_path",
                     f"trainer.resume_from_path={tmp_path / f'ckpt-{step}'}"]) == 0
        got = _records(run)
        assert sorted(got) == list(range(step + 1, 6))
        for s in (4, 5):
            if s > step:  # a share of 16 rollouts: float32 rounding of the features may not move one of them
                assert abs(got[s][METRIC] - expected[s][METRIC]) <= float32_tol(expected[s][METRIC], 16), (step, s)
        if step == 2:  # the fit made after resuming equals the uninterrupted run's
            fitted, again = (load_tensors(d / "global_step_4" / RM_OUTLIERS_FILE) for d in (straight, run))
            assert fitted["threshold"] == again["threshold"]
            assert torch.equal(fitted["precision"], again["precision"])

    # a checkpoint without the file (its run scored without a reward model): the baseline is collected anew
    (tmp_path / "ckpt-4" / RM_OUTLIERS_FILE).unlink()  # and a manifest without it
    write_manifest(tmp_path / "ckpt-4")
    capsys.readouterr()
    assert main(["train", *args, f"trainer.default_local_dir={tmp_path / 'fresh'}", "trainer.resume_mode=resume_path",
                 f"trainer.resume_from_path={tmp_path / 'ckpt-4'}"]) == 0
    assert "holds no reward-model feature baseline; it is collected from this step on" in capsys.readouterr().err
    assert METRIC not in _records(tmp_path / "fresh")[5]
