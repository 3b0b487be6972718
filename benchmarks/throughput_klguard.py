"""klguard's contender in the throughput benchmark (started by benchmarks/throughput.py; not run by hand).

Builds a `PPOTrainer` through the Python API from verl overrides and runs its ordinary `fit` loop
(guard, tracker and progress hooks included; no validation or checkpoints inside the measured
steps). After each step the progress hook reports the step's wall time and klguard's own
`timing_s/*` phases to the driver, then waits for the next release (throughput_common.Gate).

The KL guard (on by default) is switched off inside `fit`: on these random-init models it would roll
back and change the work, and TRL has none. To measure what it costs, a shadow `KLGuard` with
`enable=true` observes every step's metrics and its time is reported apart (`guard_s`, not part of the
step; the table prints it as a share of the step).
"""

from __future__ import annotations

import dataclasses
import time

import torch
from throughput_common import Gate, read_spec

from klguard.builtin.task import TASK
from klguard.config import load_config
from klguard.guard import KLGuard
from klguard.ppo.trainer import PPOTrainer

# Rollout-side phases as klguard times them; the old log-probs come out of the sampling loop (in gen).
PHASES = ("gen", "reward", "ref", "values")


def overrides(spec: dict) -> list[str]:
    prompts = spec["rollouts"] // spec["n"]
    out = [
        f"data.train_files={spec['train']}", f"data.val_files={spec['val']}", f"data.train_batch_size={prompts}",
        f"data.max_response_length={spec['response_length']}", "data.max_prompt_length=64",
        f"actor_rollout_ref.model.path={spec['policy']}", f"actor_rollout_ref.rollout.n={spec['n']}",
        "actor_rollout_ref.rollout.ignore_eos=true", f"actor_rollout_ref.actor.ppo_mini_batch_size={prompts}",
        "actor_rollout_ref.actor.ppo_epochs=1", "proxy_reward.enable=false", "trainer.device=cpu",
        f"trainer.total_training_steps={spec['max_steps']}", "trainer.test_freq=-1", "trainer.save_freq=-1",
        "trainer.val_before_train=false", f"trainer.default_local_dir={spec['run_dir']}", "trainer.resume_mode=disable",
        "trainer.progress_bar=false", "trainer.logger=[jsonl]", f"trainer.seed={spec['seed']}", "guard.enable=false",
        "trainer.report=false",
    ]
    if spec["algo"] == "ppo":  # GAE with a critic, KL in the reward (klguard's defaults)
        out += ["algorithm.adv_estimator=gae", "algorithm.use_kl_in_reward=true"]
    else:  # GRPO: KL as a loss term, coefficient and estimator as TRL's beta=0.04 (k3)
        out += ["algorithm.adv_estimator=grpo", "algorithm.use_kl_in_reward=false",
                "actor_rollout_ref.actor.use_kl_loss=true", "actor_rollout_ref.actor.kl_loss_coef=0.04",
                "actor_rollout_ref.actor.kl_loss_type=low_var_kl"]
    if spec["reward"] == "model":
        out += ["reward_model.enable=true", f"reward_model.model.path={spec['rm']}"]
    if spec.get("profile_step"):
        out += ["global_profiler.tool=torch", f"global_profiler.steps=[{spec['profile_step']}]"]
    if spec.get("compile_decode"):
        out.append("actor_rollout_ref.rollout.enforce_eager=false")
    if spec["dtype"] == "bf16":
        out += ["actor_rollout_ref.actor.fsdp_config.dtype=bfloat16", "critic.model.fsdp_config.dtype=bfloat16"]
    return out


class _NoTracker:
    def log(self, metrics: dict[str, float], step: int) -> None:
        pass


def main() -> None:
    spec = read_spec()
    torch.set_num_threads(spec["threads"])
    gate = Gate()
    config = load_config(overrides=overrides(spec)).config
    trainer = PPOTrainer(config, task=TASK, log=lambda msg: None)
    shadow = KLGuard(dataclasses.replace(config.guard, enable=True), total_steps=trainer.total_steps,
                     target_kl=config.algorithm.kl_ctrl.target_kl, kl_coef=config.algorithm.kl_ctrl.kl_coef)

    def progress(step: int, metrics: dict[str, float]) -> None:
        phases = {name: metrics.get(f"timing_s/{name}", 0.0) for name in PHASES}
        phases["update"] = metrics.get("timing_s/update_critic", 0.0) + metrics.get("timing_s/update_actor", 0.0)
        started = time.perf_counter()
        shadow.observe(step, metrics)
        guard_s = time.perf_counter() - started
        gate.step_done(phases, exclude_s=guard_s, train_step_s=metrics["timing_s/step"], guard_s=guard_s,
                       response_length=metrics.get("response_length/mean"))

    gate.ready(contender="klguard")
    trainer.fit(_NoTracker(), progress=progress)


if __name__ == "__main__":
    main()
