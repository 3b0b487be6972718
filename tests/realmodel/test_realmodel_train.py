"""The acceptance runs: PPO with a reward model, GRPO with a custom reward file, export, and verl's own
GSM8K launch line, all on a tiny local Qwen2 (nothing downloaded)."""

from __future__ import annotations

import json
import shlex
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from klguard.commands.cli import main


def _records(run: Path) -> list[dict]:
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]


def _train_steps(run: Path) -> list[dict]:
    return [r for r in _records(run) if "critic/score/mean" in r]


def test_ppo_with_reward_model_three_steps(base_overrides, assets, tmp_path):
    code = main(["train", *base_overrides, "reward_model.enable=true", f"reward_model.model.path={assets.rm}",
                 "reward_model.micro_batch_size_per_gpu=3", "reward_model.length_penalty=0.01"])
    assert code == 0
    steps = _train_steps(tmp_path / "run")
    assert [r["step"] for r in steps] == [1, 2, 3]
    for r in steps:
        assert all(torch.isfinite(torch.tensor(r[k])) for k in ("critic/score/mean", "actor/pg_loss",
                                                                "critic/vf_loss", "actor/grad_norm"))
        assert "hacking/gold_score" in r  # openai/gsm8k has a rule: it is kept as the gold score
        # a random RM scores near 0 and 8 tokens cost 0.08; the gold rule alone would give exactly 0 or 1
        assert r["critic/score/mean"] not in (0.0, 1.0)
    assert (tmp_path / "run" / "global_step_3" / "actor" / "model.safetensors").is_file()


def test_grpo_with_custom_reward_then_export_loads_in_plain_transformers(base_overrides, assets, tmp_path):
    code = main(["train", *base_overrides, "algorithm.adv_estimator=grpo", "actor_rollout_ref.rollout.n=4",
                 f"custom_reward_function.path={assets.reward_file}", "actor_rollout_ref.actor.use_kl_loss=true",
                 "algorithm.use_kl_in_reward=false", "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=4"])
    assert code == 0
    steps = _train_steps(tmp_path / "run")
    assert [r["step"] for r in steps] == [1, 2, 3]
    assert all(r["critic/score/mean"] >= 7.0 for r in steps)  # the custom function's scores, 16 rollouts a step
    assert "actor/kl_loss" in steps[-1]

    out = tmp_path / "export"
    assert main(["export", str(tmp_path / "run"), str(out)]) == 0  # a run dir: its latest checkpoint
    assert {"config.json", "generation_config.json", "model.safetensors", "tokenizer_config.json"} <= {
        p.name for p in out.iterdir()}
    assert "auto_map" not in json.loads((out / "config.json").read_text())  # no custom code needed
    model = AutoModelForCausalLM.from_pretrained(out)
    tok = AutoTokenizer.from_pretrained(out)
    assert type(model).__module__.startswith("transformers.models.qwen2")
    trained = AutoModelForCausalLM.from_pretrained(tmp_path / "run" / "global_step_3" / "actor")
    for (name, a), b in zip(model.state_dict().items(), trained.state_dict().values(), strict=True):
        assert torch.equal(a, b), name
    text = tok.apply_chat_template([{"role": "user", "content": "Tom has 3 apples."}], add_generation_prompt=True,
                                   tokenize=False)
    ids = tok(text, return_tensors="pt")
    generated = model.generate(**ids, max_new_tokens=5, do_sample=False)
    assert ids["input_ids"].shape[1] < generated.shape[1] <= ids["input_ids"].shape[1] + 5


# verl's examples/ppo_trainer/run_gemma.sh (GSM8K PPO, function reward) as a verl user runs it; only
# paths, batch sizes and lengths are changed (and wandb, not installed here, becomes console).
RUN_GEMMA = """
    algorithm.adv_estimator=gae
    data.train_files={train} data.val_files={val}
    data.train_batch_size=8 data.max_prompt_length=128 data.max_response_length=4
    data.filter_overlong_prompts=True data.truncation='error'
    actor_rollout_ref.model.path={policy}
    actor_rollout_ref.actor.optim.lr=1e-6
    actor_rollout_ref.model.use_remove_padding=False
    actor_rollout_ref.actor.ppo_mini_batch_size=4
    actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2
    actor_rollout_ref.actor.fsdp_config.param_offload=False
    actor_rollout_ref.actor.fsdp_config.optimizer_offload=False
    actor_rollout_ref.actor.use_kl_loss=False
    actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=2
    actor_rollout_ref.rollout.tensor_model_parallel_size=2
    actor_rollout_ref.rollout.name=vllm
    actor_rollout_ref.rollout.gpu_memory_utilization=0.4
    actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=2
    actor_rollout_ref.ref.fsdp_config.param_offload=True
    critic.optim.lr=1e-5
    critic.model.use_remove_padding=False
    critic.model.path={policy}
    critic.model.enable_gradient_checkpointing=False
    critic.ppo_micro_batch_size_per_gpu=2
    critic.model.fsdp_config.param_offload=False
    critic.model.fsdp_config.optimizer_offload=False
    algorithm.use_kl_in_reward=False
    trainer.critic_warmup=0
    trainer.logger=['console']
    trainer.project_name='verl_example'
    trainer.experiment_name='gemma2b_function_rm'
    trainer.n_gpus_per_node=1
    trainer.nnodes=1
    trainer.save_freq=20
    trainer.test_freq=10
    trainer.total_epochs=15
"""


def test_verl_run_gemma_line_runs_with_one_warning(assets, tmp_path, capsys):
    line = RUN_GEMMA.format(train=assets.train, val=assets.val, policy=assets.policy)
    # klguard's trainer.total_training_steps defaults to 200 (demo-sized); null lets total_epochs rule, as in verl
    args = [*shlex.split(line), f"trainer.default_local_dir={tmp_path / 'run'}", "trainer.progress_bar=false",
            "trainer.total_training_steps=null"]
    assert main(["train", *args]) == 0
    err = capsys.readouterr().err
    warnings = [x for x in err.splitlines() if "warning" in x.lower()]
    assert len(warnings) == 1, warnings
    for key in ("actor_rollout_ref.rollout.name=vllm", "actor_rollout_ref.rollout.gpu_memory_utilization",
                "actor_rollout_ref.model.use_remove_padding",
                "actor_rollout_ref.actor.fsdp_config.param_offload", "trainer.n_gpus_per_node"):
        assert key in warnings[0]
    assert (tmp_path / "run" / "global_step_15" / "actor" / "config.json").is_file()  # 15 epochs x 1 step
