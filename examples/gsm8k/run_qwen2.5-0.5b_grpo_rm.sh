#!/usr/bin/env bash
# GSM8K GRPO (rollout.n=5, no critic) for Qwen2.5-0.5B-Instruct on one GPU, optimising a sequence-classification
# reward model with a length penalty plus the GSM8K rule: RM(q, o) - 0.001 * |o| + 1.0 * gsm8k_strict.
# RM: any local AutoModelForSequenceClassification folder with one label (e.g. a Skywork/FsfairX reward model).
set -x

MODEL=${MODEL:-$HOME/models/Qwen2.5-0.5B-Instruct}
RM=${RM:-$HOME/models/reward-model}
DATA=${DATA:-$HOME/data/gsm8k}

python3 -m klguard train \
    algorithm.adv_estimator=grpo \
    data.train_files=$DATA/train.parquet \
    data.val_files=$DATA/test.parquet \
    data.train_batch_size=64 \
    data.max_prompt_length=512 \
    data.max_response_length=512 \
    data.filter_overlong_prompts=True \
    actor_rollout_ref.model.path=$MODEL \
    actor_rollout_ref.model.enable_gradient_checkpointing=True \
    actor_rollout_ref.actor.optim.lr=1e-6 \
    actor_rollout_ref.actor.ppo_mini_batch_size=32 \
    actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=16 \
    actor_rollout_ref.actor.fsdp_config.dtype=bfloat16 \
    actor_rollout_ref.actor.use_kl_loss=True \
    actor_rollout_ref.actor.kl_loss_coef=0.001 \
    actor_rollout_ref.actor.kl_loss_type=low_var_kl \
    actor_rollout_ref.rollout.n=5 \
    reward_model.enable=True \
    reward_model.model.path=$RM \
    reward_model.micro_batch_size_per_gpu=32 \
    reward_model.length_penalty=0.001 \
    reward_model.rule_weight=1.0 \
    algorithm.use_kl_in_reward=False \
    trainer.logger='["console","tensorboard"]' \
    trainer.project_name='klguard_examples' \
    trainer.experiment_name='qwen2.5-0.5b_gsm8k_grpo_rm' \
    trainer.device=cuda \
    trainer.save_freq=50 \
    trainer.test_freq=10 \
    trainer.total_training_steps=null \
    trainer.total_epochs=5 "$@"
