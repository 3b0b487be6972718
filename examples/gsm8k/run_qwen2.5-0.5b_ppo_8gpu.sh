#!/usr/bin/env bash
# GSM8K PPO for Qwen2.5-0.5B-Instruct on 8 GPUs of one node: the same line under torchrun, with verl's batch
# sizes for 8 GPUs; FSDP2 shards actor, critic and reference over the ranks (tested on CPU/gloo, not yet on GPUs).
set -x

MODEL=${MODEL:-$HOME/models/Qwen2.5-0.5B-Instruct}
DATA=${DATA:-$HOME/data/gsm8k}

torchrun --standalone --nnodes=1 --nproc_per_node=8 -m klguard train \
    algorithm.adv_estimator=gae \
    data.train_files=$DATA/train.parquet \
    data.val_files=$DATA/test.parquet \
    data.train_batch_size=1024 \
    data.max_prompt_length=512 \
    data.max_response_length=512 \
    data.filter_overlong_prompts=True \
    data.truncation='error' \
    actor_rollout_ref.model.path=$MODEL \
    actor_rollout_ref.model.enable_gradient_checkpointing=True \
    actor_rollout_ref.actor.strategy=fsdp2 \
    actor_rollout_ref.actor.optim.lr=1e-6 \
    actor_rollout_ref.actor.ppo_mini_batch_size=256 \
    actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=16 \
    actor_rollout_ref.actor.fsdp_config.dtype=bfloat16 \
    actor_rollout_ref.actor.fsdp_config.param_offload=False \
    actor_rollout_ref.actor.fsdp_config.optimizer_offload=False \
    actor_rollout_ref.actor.use_kl_loss=False \
    actor_rollout_ref.rollout.name=vllm \
    actor_rollout_ref.rollout.gpu_memory_utilization=0.5 \
    actor_rollout_ref.rollout.tensor_model_parallel_size=1 \
    actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=32 \
    actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=32 \
    critic.strategy=fsdp2 \
    critic.model.path=$MODEL \
    critic.model.enable_gradient_checkpointing=True \
    critic.model.fsdp_config.dtype=bfloat16 \
    critic.optim.lr=1e-5 \
    critic.ppo_micro_batch_size_per_gpu=16 \
    algorithm.use_kl_in_reward=True \
    algorithm.kl_ctrl.kl_coef=0.05 \
    trainer.critic_warmup=0 \
    trainer.logger='["console","tensorboard"]' \
    trainer.project_name='klguard_examples' \
    trainer.experiment_name='qwen2.5-0.5b_gsm8k_ppo_8gpu' \
    trainer.n_gpus_per_node=8 \
    trainer.nnodes=1 \
    trainer.device=cuda \
    trainer.save_freq=50 \
    trainer.test_freq=10 \
    trainer.total_training_steps=null \
    trainer.total_epochs=15 "$@"
