"""A verl 0.9.1 launch line (the `reward.*` block, TensorBoard and console loggers) runs on klguard, the run
directory's metrics.jsonl is there whatever `trainer.logger` says, and `file` writes verl's own format."""

from __future__ import annotations

import json
import shlex

from klguard.commands.cli import main

# verl 0.9.1's GRPO example shape (examples/grpo_trainer) with the reward block 0.9.1 introduced; only paths,
# batch sizes and lengths are changed. The custom function is the gold rule beside the RM (rule_weight 0).
GRPO_0_9_1 = """
    algorithm.adv_estimator=grpo
    data.train_files={train} data.val_files={val}
    data.train_batch_size=4 data.max_prompt_length=128 data.max_response_length=8
    actor_rollout_ref.model.path={policy}
    actor_rollout_ref.actor.optim.lr=1e-3
    actor_rollout_ref.actor.ppo_mini_batch_size=2
    actor_rollout_ref.actor.use_kl_loss=True
    actor_rollout_ref.actor.kl_loss_coef=0.001
    actor_rollout_ref.actor.kl_loss_type=low_var_kl
    actor_rollout_ref.rollout.name=vllm
    actor_rollout_ref.rollout.n=2
    algorithm.use_kl_in_reward=False
    reward.num_workers=1
    reward.reward_manager.name=naive
    reward.reward_model.enable=True
    reward.reward_model.model_path={rm}
    reward.reward_model.rollout.name=vllm
    reward.reward_model.rollout.gpu_memory_utilization=0.5
    reward.custom_reward_function.path={reward_file}
    reward.custom_reward_function.name=compute_score
    +reward.custom_reward_function.reward_kwargs.bonus=0.5
    trainer.logger=['console','tensorboard','file']
    trainer.project_name=verl_grpo_example
    trainer.experiment_name=rm_0_9_1
    trainer.n_gpus_per_node=1
    trainer.total_training_steps=2 trainer.test_freq=-1 trainer.save_freq=-1
    trainer.use_v1=True
"""

REWARD_WITH_KWARGS = '''
def compute_score(data_source, solution_str, ground_truth, extra_info=None, bonus=0.0):
    return 1.0 + bonus
'''


def test_a_0_9_1_reward_block_line_runs_and_every_logger_list_writes_metrics_jsonl(
        assets, tmp_path, monkeypatch, capsys):
    reward_file = tmp_path / "reward_kwargs.py"
    reward_file.write_text(REWARD_WITH_KWARGS)
    verl_file = tmp_path / "verl_logs" / "run.jsonl"
    monkeypatch.setenv("VERL_FILE_LOGGER_PATH", str(verl_file))
    line = GRPO_0_9_1.format(train=assets.train, val=assets.val, policy=assets.policy, rm=assets.rm,
                             reward_file=reward_file)
    args = [*shlex.split(line), f"trainer.default_local_dir={tmp_path / 'run'}", "trainer.progress_bar=false",
            "trainer.device=cpu"]
    assert main(["train", *args]) == 0
    warnings = [x for x in capsys.readouterr().err.splitlines() if "warning" in x.lower()]
    assert len(warnings) == 1 and warnings[0].startswith("klguard: warning: 7 verl keys not applicable")
    for key in ("reward.num_workers", "reward.reward_manager.name", "reward.reward_model.rollout.name",
                "trainer.use_v1", "actor_rollout_ref.rollout.name=vllm"):
        assert key in warnings[0]

    rows = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in rows if "critic/score/mean" in r]
    assert [r["step"] for r in steps] == [1, 2]
    # the RM scored (a random RM gives neither 0 nor 1) and the custom rule, with its kwarg, is the gold score
    assert all(r["critic/score/mean"] not in (0.0, 1.0, 1.5) for r in steps)
    assert all(r["hacking/gold_score"] == 1.5 for r in steps)
    assert (tmp_path / "run" / "report.html").is_file()
    assert list((tmp_path / "run" / "tensorboard").glob("events.out.tfevents.*"))

    verl_rows = [json.loads(x) for x in verl_file.read_text().splitlines()]
    assert [set(r) for r in verl_rows] == [{"step", "data"}] * len(verl_rows)
    by_step = {r["step"]: r["data"] for r in verl_rows}
    for row in rows:
        assert by_step[row["step"]] == {k: v for k, v in row.items() if k != "step"}
