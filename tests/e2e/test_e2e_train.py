"""End-to-end PPO on the built-in task: metrics, checkpoints, resume."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from klguard.builtin.char_tokenizer import build_char_tokenizer
from klguard.builtin.tiny import build_tiny_llama
from klguard.commands.cli import main
from klguard.ppo import shared_prefix
from tolerances import forward_terms, metric_tol

REQUIRED_METRICS = [
    "actor/ppo_kl", "actor/policy_ratio", "actor/pg_loss", "actor/pg_clipfrac", "actor/pg_clipfrac_lower",
    "actor/entropy",
    "actor/grad_norm", "actor/lr", "actor/reward_kl_penalty", "actor/reward_kl_penalty_coeff", "critic/vf_loss",
    "critic/score/mean", "critic/rewards/mean", "critic/advantages/mean", "response_length/mean",
    "response_length/clip_ratio", "timing_s/gen", "timing_s/ref", "timing_s/update_actor", "timing_s/step",
    "perf/throughput", "hacking/gold_score", "hacking/proxy_score", "hacking/gap", "hacking/rate",
]


# Runs that differ by rounding only (shared vs plain prompt forwards, compiled vs eager decode) are compared at
# tests/tolerances.py metric_tol: each step's (forward_terms(policy) + token positions) x eps32 x the scale of the
# metric's terms, times the step. A token sampled differently moves score/mean by >= 1/(32 x rows), the losses by
# ~1e-2.
POLICY_TERMS = forward_terms(build_tiny_llama(build_char_tokenizer()))  # the SFT policy (and critic)


def _records(run: Path) -> list[dict]:
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]


def test_two_step_run_writes_metrics_checkpoints_and_hf_folders(fast_overrides, tmp_path):
    code = main(["train", *fast_overrides, "trainer.total_training_steps=2", "trainer.save_freq=1",
                 "trainer.test_freq=1", "trainer.report=true"])
    assert code == 0
    run = tmp_path / "run"
    records = _records(run)
    assert [r["step"] for r in records] == [0, 1, 2]  # validation before training, then two steps
    assert "val-core/klguard/arith/acc/mean@1" in records[0]
    for record in records[1:]:
        missing = [k for k in REQUIRED_METRICS if k not in record]
        assert not missing, missing
        assert record["val-core/klguard/arith/acc/mean@1"] is not None
    assert (run / "config.yaml").is_file() and list((run / "tensorboard").iterdir())
    assert (run / "latest_checkpointed_iteration.txt").read_text() == "2"
    assert "data:image/png;base64," in (run / "report.html").read_text()
    # the checkpoint's policy is a plain HF folder
    actor = run / "global_step_2" / "actor"
    model = AutoModelForCausalLM.from_pretrained(actor)
    tok = AutoTokenizer.from_pretrained(actor)
    ids = tok(tok.apply_chat_template([{"role": "user", "content": "12+3=?"}], add_generation_prompt=True,
                                      tokenize=False), return_tensors="pt")["input_ids"]
    assert torch.isfinite(model(ids).logits).all()


def test_rollout_and_validation_dumps_hold_every_response_in_verls_fields(fast_overrides, tmp_path):
    """trainer.rollout_data_dir / validation_data_dir: <dir>/<step>.jsonl, one line per response, verl's fields
    (input, output, gts, score, step) and the task's gold; what the dump says is what the metrics averaged."""
    rollouts, validations = tmp_path / "rollouts", tmp_path / "val"
    code = main(["train", *fast_overrides, "trainer.total_training_steps=2", "trainer.test_freq=2",
                 "trainer.save_freq=-1", f"trainer.rollout_data_dir={rollouts}",
                 f"trainer.validation_data_dir={validations}"])
    assert code == 0
    assert sorted(p.name for p in rollouts.iterdir()) == ["1.jsonl", "2.jsonl"]
    assert sorted(p.name for p in validations.iterdir()) == ["0.jsonl", "2.jsonl"]  # before training, at the end
    records = _records(tmp_path / "run")
    for step in (1, 2):
        lines = [json.loads(x) for x in (rollouts / f"{step}.jsonl").read_text().splitlines()]
        assert len(lines) == 16 * 1  # data.train_batch_size x rollout.n
        assert {"input", "output", "gts", "score", "step", "prompt", "gold", "hacked"} <= set(lines[0])
        assert {line["step"] for line in lines} == {step}
        assert all(line["prompt"] in line["input"] for line in lines)
        gold = sum(line["gold"] for line in lines) / len(lines)
        assert gold == pytest.approx(records[step]["hacking/gold_score"], abs=1e-6)
    val = [json.loads(x) for x in (validations / "2.jsonl").read_text().splitlines()]
    assert len(val) == 16  # data.builtin_val_size x val_kwargs.n
    gold = sum(line["gold"] for line in val) / len(val)
    assert gold == pytest.approx(records[2]["val-core/klguard/arith/acc/mean@1"], abs=1e-6)


def test_resume_continues_at_the_right_step_with_the_same_kl_coefficient(fast_overrides, tmp_path):
    adaptive = ["algorithm.kl_ctrl.type=adaptive", "algorithm.kl_ctrl.horizon=50", "algorithm.kl_ctrl.kl_coef=0.1",
                "trainer.save_freq=2", "trainer.test_freq=-1", "trainer.val_before_train=false"]
    straight = [*fast_overrides, *adaptive, "trainer.total_training_steps=4",
                f"trainer.default_local_dir={tmp_path / 'straight'}"]
    assert main(["train", *straight]) == 0
    resumed = [*fast_overrides, *adaptive, f"trainer.default_local_dir={tmp_path / 'resumed'}"]
    assert main(["train", *resumed, "trainer.total_training_steps=2"]) == 0
    assert main(["train", *resumed, "trainer.total_training_steps=4"]) == 0
    full = {r["step"]: r for r in _records(tmp_path / "straight")}
    parts = _records(tmp_path / "resumed")
    assert [r["step"] for r in parts] == [1, 2, 3, 4]
    coeffs = [full[s]["actor/reward_kl_penalty_coeff"] for s in (1, 2, 3, 4)]
    assert len(set(coeffs)) > 1  # the adaptive controller really moved
    for r in parts:  # the same computation: resuming is exact (the reliability tests check it bit for bit)
        assert r["actor/reward_kl_penalty_coeff"] == full[r["step"]]["actor/reward_kl_penalty_coeff"]
        assert r["critic/score/mean"] == full[r["step"]]["critic/score/mean"]
        assert r["actor/pg_loss"] == full[r["step"]]["actor/pg_loss"]


def test_total_epochs_sets_the_length_when_total_training_steps_is_null(fast_overrides, tmp_path):
    # 64 prompts in batches of 16: 4 steps an epoch, 2 epochs
    code = main(["train", *fast_overrides, "trainer.total_training_steps=null", "trainer.total_epochs=2",
                 "trainer.val_before_train=false", "trainer.test_freq=-1", "trainer.save_freq=-1"])
    assert code == 0
    records = _records(tmp_path / "run")
    assert [r["step"] for r in records] == list(range(1, 9))
    assert [r["training/epoch"] for r in records] == [0, 0, 0, 0, 1, 1, 1, 1]


def test_eval_reproduces_the_final_validation(fast_overrides, tmp_path, capsys):
    assert main(["train", *fast_overrides, "trainer.total_training_steps=2", "trainer.test_freq=-1"]) == 0
    final = _records(tmp_path / "run")[-1]
    capsys.readouterr()
    assert main(["eval", str(tmp_path / "run" / "global_step_2"), *fast_overrides]) == 0
    printed = dict(line.split() for line in capsys.readouterr().out.splitlines())
    key = "val-core/klguard/arith/acc/mean@1"
    # shares of the 16 validation prompts (exact in float): any change is >= 1/16, 1e-4 only absorbs printing
    assert float(printed[key]) == pytest.approx(final[key], abs=1e-4)
    assert float(printed["val-aux/klguard/arith/hacking_rate/mean@1"]) == pytest.approx(
        final["val-aux/klguard/arith/hacking_rate/mean@1"], abs=1e-4)


def test_grpo_with_shared_prompt_forwards_trains_like_the_plain_forwards(fast_overrides, tmp_path, monkeypatch):
    """rollout.n=4: the reference, actor (and here a critic too) run each prompt once per group; three steps
    give the same metrics as full forwards, up to float rounding."""
    runs, calls = {}, {"true": 0, "false": 0}
    real = shared_prefix.shared_prefix_forward
    for share in ("true", "false"):
        def counted(*args, share=share, **kwargs):
            calls[share] += 1
            return real(*args, **kwargs)

        monkeypatch.setattr(shared_prefix, "shared_prefix_forward", counted)
        run = tmp_path / f"share_{share}"
        code = main(["train", *fast_overrides, f"trainer.default_local_dir={run}", "trainer.total_training_steps=3",
                     "trainer.save_freq=-1", "trainer.val_before_train=false", "algorithm.adv_estimator=grpo",
                     "actor_rollout_ref.rollout.n=4", "data.train_batch_size=8",
                     "actor_rollout_ref.actor.ppo_mini_batch_size=4", "actor_rollout_ref.actor.use_kl_loss=true",
                     "algorithm.use_kl_in_reward=false", "critic.enable=true",
                     f"actor_rollout_ref.model.share_prompt_forward={share}", "guard.enable=false"])
        assert code == 0
        runs[share] = _records(run)
    keys = ["actor/pg_loss", "actor/kl_loss", "actor/entropy", "actor/grad_norm", "critic/vf_loss",
            "critic/values/mean", "response_length/mean", "critic/score/mean"]
    assert len(runs["true"]) == len(runs["false"]) == 3
    assert calls["false"] == 0 and calls["true"] >= 3 * 3  # reference, values and actor forwards, every step
    for shared, plain in zip(runs["true"], runs["false"], strict=True):
        for key in keys:
            tol = metric_tol(runs["false"], key, plain["step"], 8 * 4, POLICY_TERMS)  # 8 prompts x rollout.n = 4
            assert shared[key] == pytest.approx(plain[key], rel=0, abs=tol), (plain["step"], key)


def test_compiled_decode_trains_like_the_eager_loop(fast_overrides, tmp_path, monkeypatch):
    """rollout.enforce_eager=false: rollouts and validation decode through the compiled step and sample the
    same tokens, so two steps give the eager run's metrics up to float rounding."""
    from klguard.ppo import compiled_decode

    torch._dynamo.reset()
    steps = {"true": 0, "false": 0}
    real = compiled_decode.CompiledDecoder.step
    runs = {}
    for eager in ("true", "false"):
        def counted(self, *args, eager=eager, **kwargs):
            steps[eager] += 1
            return real(self, *args, **kwargs)

        monkeypatch.setattr(compiled_decode.CompiledDecoder, "step", counted)
        run = tmp_path / f"eager_{eager}"
        assert main(["train", *fast_overrides, f"trainer.default_local_dir={run}", "trainer.total_training_steps=2",
                     "trainer.save_freq=-1", "trainer.test_freq=2", "guard.enable=false",
                     f"actor_rollout_ref.rollout.enforce_eager={eager}"]) == 0
        runs[eager] = _records(run)
    assert steps["true"] == 0 and steps["false"] > 2 * 15  # every decode step of two rollouts and validations
    keys = ["actor/pg_loss", "actor/ppo_kl", "critic/vf_loss", "response_length/mean", "critic/score/mean",
            "val-core/klguard/arith/acc/mean@1"]
    assert len(runs["true"]) == len(runs["false"]) == 3
    for compiled, plain in zip(runs["false"], runs["true"], strict=True):
        for key in keys:
            if key in plain:
                tol = metric_tol(runs["true"], key, plain["step"], 16, POLICY_TERMS)  # 16 prompts a step
                assert compiled[key] == pytest.approx(plain[key], rel=0, abs=tol), (plain["step"], key)
    torch._dynamo.reset()


def test_global_profiler_traces_the_listed_step_with_its_phases(fast_overrides, tmp_path):
    import gzip

    code = main(["train", *fast_overrides, "trainer.total_training_steps=2", "trainer.test_freq=-1",
                 "global_profiler.tool=torch", "global_profiler.steps=[2]"])
    assert code == 0
    profiles = tmp_path / "run" / "profile"  # the default save_path: the run directory's profile/
    assert [p.name for p in profiles.iterdir()] == ["step_2"]
    with gzip.open(profiles / "step_2" / "rank0.pt.trace.json.gz", "rt") as f:
        names = {event.get("name") for event in json.load(f)["traceEvents"]}
    # the trainer's phases as labelled ranges (step 2 is the last: it validates), and the operators under them
    assert {"gen", "reward", "ref", "values", "adv", "update_critic", "update_actor", "validate"} <= names
    assert "aten::mm" in names
    assert "aten::mm" in (profiles / "step_2" / "rank0.txt").read_text()
