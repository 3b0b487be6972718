"""Launch lines in verl's style (written for this test), given to `klguard train --print-config` as a verl user
would: each FSDP text-model line loads; each line klguard's trainer cannot run gives one line that names the feature
and the same line for verl with klguard's plugin (`trainer.v1.trainer_mode=klguard`)."""

from __future__ import annotations

import shlex

import pytest

from klguard.commands.cli import main
from klguard.config import load_config

BASE = """python3 -m verl.trainer.main_ppo \\
    data.train_files=$HOME/data/gsm8k/train.parquet data.val_files=$HOME/data/gsm8k/test.parquet \\
    data.train_batch_size=256 data.max_prompt_length=512 data.max_response_length=1024 \\
    actor_rollout_ref.model.path=Qwen/Qwen2.5-3B-Instruct actor_rollout_ref.actor.optim.lr=1e-6 \\
    actor_rollout_ref.actor.ppo_mini_batch_size=64 actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=8 \\
    actor_rollout_ref.rollout.name=vllm actor_rollout_ref.rollout.gpu_memory_utilization=0.6 \\
    trainer.logger='["console","wandb"]' trainer.n_gpus_per_node=8 trainer.nnodes=1 trainer.total_epochs=15"""
GROUP = "algorithm.adv_estimator={est} actor_rollout_ref.rollout.n=5 algorithm.use_kl_in_reward=False"

LOADS = {
    "ppo_gae": "algorithm.adv_estimator=gae critic.model.path=Qwen/Qwen2.5-3B-Instruct critic.optim.lr=1e-5 "
               "critic.ppo_micro_batch_size_per_gpu=8",
    **{f"estimator_{e}": GROUP.format(est=e) for e in ("grpo", "rloo", "reinforce_plus_plus_baseline", "gpg")},
    "estimator_reinforce_plus_plus": "algorithm.adv_estimator=reinforce_plus_plus",
    "estimator_remax": "algorithm.adv_estimator=remax actor_rollout_ref.rollout.n=1",
    "estimator_otb": GROUP.format(est="optimal_token_baseline")
                     + " actor_rollout_ref.actor.calculate_sum_pi_squared=True",
    "estimator_gdpo": GROUP.format(est="gdpo") + " +algorithm.gdpo_reward_keys='[format_reward,accuracy_reward]' "
                      "+algorithm.gdpo_reward_weights='[0.5,1.0]'",
    "grpo_one_response": "algorithm.adv_estimator=grpo actor_rollout_ref.rollout.n=1",
    "rloo_one_response": "algorithm.adv_estimator=rloo actor_rollout_ref.rollout.n=1",
    **{f"loss_{m}": GROUP.format(est="grpo") + f" actor_rollout_ref.actor.policy_loss.loss_mode={m}"
       for m in ("vanilla", "gspo", "gpg", "clip_cov", "kl_cov", "geo_mean", "dppo_tv", "dppo_kl")},
    "loss_dro": GROUP.format(est="grpo") + " actor_rollout_ref.actor.policy_loss.loss_mode=dro "
                "+actor_rollout_ref.actor.policy_loss.dro_beta=0.1",
    "loss_cispo": GROUP.format(est="grpo") + " actor_rollout_ref.actor.policy_loss.loss_mode=cispo "
                  "actor_rollout_ref.actor.clip_ratio_low=10 actor_rollout_ref.actor.clip_ratio_high=0.2",
    "loss_sapo": GROUP.format(est="grpo") + " actor_rollout_ref.actor.policy_loss.loss_mode=sapo "
                 "actor_rollout_ref.actor.tau_pos=1.0 actor_rollout_ref.actor.tau_neg=1.05",
    "dapo": GROUP.format(est="grpo") + " actor_rollout_ref.actor.clip_ratio_low=0.2 "
            "actor_rollout_ref.actor.clip_ratio_high=0.28 actor_rollout_ref.actor.loss_agg_mode=token-mean "
            "algorithm.filter_groups.enable=True algorithm.filter_groups.metric=acc "
            "algorithm.filter_groups.max_num_gen_batches=10 reward_model.reward_manager=dapo "
            "+reward_model.reward_kwargs.overlong_buffer_cfg.enable=True "
            "+reward_model.reward_kwargs.overlong_buffer_cfg.len=256 "
            "+reward_model.reward_kwargs.overlong_buffer_cfg.penalty_factor=1.0 "
            "+reward_model.reward_kwargs.overlong_buffer_cfg.log=False +reward_model.reward_kwargs.max_resp_len=1024",
    "dapo_0_9_1_spelling": GROUP.format(est="grpo") + " +reward.reward_kwargs.overlong_buffer_cfg.enable=True "
                           "+reward.reward_kwargs.overlong_buffer_cfg.len=256 "
                           "+reward.reward_kwargs.overlong_buffer_cfg.penalty_factor=0.5",
    "fsdp_precision_and_schedule": "+actor_rollout_ref.actor.fsdp_config.mixed_precision.param_dtype=bf16 "
                                   "+actor_rollout_ref.actor.fsdp_config.mixed_precision.reduce_dtype=fp32 "
                                   "+actor_rollout_ref.actor.fsdp_config.mixed_precision.buffer_dtype=fp32 "
                                   "actor_rollout_ref.actor.optim.lr_decay_style=constant "
                                   "+actor_rollout_ref.actor.fsdp_config.fsdp_plan.reduce_dtype=fp32 "
                                   "actor_rollout_ref.model.torch_dtype=bfloat16 trainer.logger=console",
    "trtllm_rollout": "actor_rollout_ref.rollout.name=trtllm",
}

PLUGIN = {
    "megatron_keys": ("actor_rollout_ref.actor.strategy=megatron "
                      "actor_rollout_ref.actor.megatron.tensor_model_parallel_size=2 "
                      "actor_rollout_ref.actor.megatron.pipeline_model_parallel_size=2", "Megatron-LM"),
    "megatron_config": ("--config-path=config --config-name=ppo_megatron_trainer.yaml "
                        "actor_rollout_ref.actor.megatron.tensor_model_parallel_size=4", "Megatron-LM"),
    "megatron_critic": ("critic.megatron.tensor_model_parallel_size=2", "Megatron-LM"),
    "veomni": ("model_engine=veomni actor_rollout_ref.actor.veomni.ulysses_parallel_size=2", "VeOmni"),
    "multimodal": ("actor_rollout_ref.model.path=Qwen/Qwen2.5-VL-7B-Instruct data.image_key=images "
                   "actor_rollout_ref.actor.freeze_vision_tower=True", "multimodal"),
    "multi_turn": ("actor_rollout_ref.rollout.multi_turn.enable=True "
                   "actor_rollout_ref.rollout.multi_turn.tool_config_path=tools.yaml", "multi-turn"),
    "npu_profiling": ("global_profiler.tool=npu global_profiler.steps='[1,2]' "
                      "actor_rollout_ref.actor.profiler.tool_config.npu.level=level1", "NPU profiling"),
    "npu_device": ("trainer.device=npu", "Ascend NPUs"),
    "nsys": ("global_profiler.tool=nsys global_profiler.steps='[1]'", "Nsight Systems"),
    "distillation": ("distillation.enabled=True distillation.distillation_loss.loss_mode=k3", "distillation"),
}


def words(extra: str) -> list[str]:
    """The line's arguments after the entry point, as the shell would split them ($HOME left as text)."""
    argv = shlex.split(BASE.replace("\\\n", " ") + " " + extra)
    return argv[argv.index("verl.trainer.main_ppo") + 1:]


@pytest.mark.parametrize("name", sorted(LOADS))
def test_fsdp_text_lines_load(name: str, capsys) -> None:
    code = main(["train", "--print-config", *words(LOADS[name])])
    out = capsys.readouterr()
    assert code == 0, out.err
    assert "error" not in out.err


def test_loaded_lines_mean_what_they_say() -> None:
    cfg = load_config(None, words(LOADS["dapo"])).config
    buffer = cfg.reward_model.reward_kwargs.overlong_buffer_cfg
    assert (buffer.enable, buffer.len, buffer.penalty_factor, cfg.reward_model.reward_kwargs.max_resp_len) == \
        (True, 256, 1.0, 1024)
    fg = cfg.algorithm.filter_groups
    assert (fg.enable, fg.metric, fg.max_num_gen_batches) == (True, "acc", 10)
    assert load_config(None, words(LOADS["dapo_0_9_1_spelling"])).config.reward_model.reward_kwargs \
        .overlong_buffer_cfg.penalty_factor == 0.5
    cfg = load_config(None, words(LOADS["fsdp_precision_and_schedule"])).config
    actor = cfg.actor_rollout_ref.actor
    assert (actor.fsdp_config.dtype, actor.optim.lr_scheduler_type, cfg.trainer.logger) == ("bf16", "constant",
                                                                                            ["console"])
    gdpo = load_config(None, words(LOADS["estimator_gdpo"])).config.algorithm
    assert (gdpo.gdpo_reward_keys, gdpo.gdpo_reward_weights) == (["format_reward", "accuracy_reward"], [0.5, 1.0])


@pytest.mark.parametrize("name", sorted(PLUGIN))
def test_other_lines_give_one_line_with_verls_command(name: str, capsys, tmp_path) -> None:
    extra, feature = PLUGIN[name]
    argv = words(extra)
    target = tmp_path / "verl_command.sh"
    hydra = [w for w in argv if w.startswith("--")]
    overrides = [w for w in argv if not w.startswith("--")]
    code = main(["train", "--print-config", "--verl-command", str(target), *hydra, *overrides])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2
    assert len(err) == 1 and err[0].startswith("klguard: error: "), err
    assert feature in err[0] and "does not run" in err[0] and "did you mean" not in err[0]
    command = err[0].split("the guard runs inside verl for this line: ", 1)[1]
    assert target.read_text().strip() == command
    assert command.startswith("python -m verl.trainer.main_ppo ")
    assert command.endswith(" trainer.v1.trainer_mode=klguard")
    assert shlex.split(command)[3:-1] == [*hydra, *overrides]  # the user's line, word for word


def test_klguards_own_guard_keys_go_under_klguard_in_verls_command(capsys) -> None:
    assert main(["train", "--print-config", *words(PLUGIN["megatron_keys"][0]), "guard.kl_hard_limit=0.2"]) == 2
    command = capsys.readouterr().err.split("for this line: ", 1)[1].strip()
    assert " +klguard.guard.kl_hard_limit=0.2 trainer.v1.trainer_mode=klguard" in command


def test_a_local_model_folder_with_a_vision_tower_is_multimodal(tmp_path, capsys) -> None:
    vision, text = tmp_path / "vl", tmp_path / "text"
    vision.mkdir()
    text.mkdir()
    (vision / "config.json").write_text('{"model_type": "qwen2_5_vl", "vision_config": {"depth": 2}}')
    (text / "config.json").write_text('{"model_type": "qwen2"}')
    assert main(["train", "--print-config", f"actor_rollout_ref.model.path={text}"]) == 0
    capsys.readouterr()
    assert main(["train", "--print-config", f"actor_rollout_ref.model.path={vision}"]) == 2
    assert "multimodal" in capsys.readouterr().err
