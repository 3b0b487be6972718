"""klguard's guard in TRL's GRPOTrainer, on klguard's built-in reward-hacking task (CPU, nothing downloaded).

    pip install -e '.[trl]'                                        # in klguard's clone
    python examples/trl/grpo_guarded.py --out grpo_runs            # unguarded and guarded, seed 1 (200 s on 2 cores)
    python examples/trl/grpo_guarded.py --only guarded "algorithm.kl_ctrl.type=pid" "algorithm.kl_ctrl.target_kl=0.03"
    klguard report grpo_runs/guarded grpo_runs/unguarded           # one HTML page comparing the two

The policy (a tiny Llama after SFT) optimises a length-biased proxy reward; the gold rule (weight 0, so TRL logs it
without training on it) says whether the answer is right. Unguarded, GRPO learns to keep writing after a correct
answer (the proxy pays per token, gold reads the last answer). The three lines that add the guard to a GRPO script
of your own are marked below: give it a gold reward where you have one, and save checkpoints (its rollback targets).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer
from trl import GRPOConfig, GRPOTrainer

from klguard.builtin.trl_task import (
    builtin_policy,
    builtin_prompts,
    evaluate_sampled,
    gold,
    hacking,
    proxy,
)
from klguard.integrations.trl import KLGuardCallback


def make_trainer(out: Path, *, seed: int, steps: int) -> GRPOTrainer:
    folder = builtin_policy()
    tokenizer = AutoTokenizer.from_pretrained(folder)
    model = AutoModelForCausalLM.from_pretrained(folder)
    args = GRPOConfig(
        output_dir=str(out), seed=seed, max_steps=steps, use_cpu=True, report_to=[], disable_tqdm=True,
        per_device_train_batch_size=64, num_generations=8, max_completion_length=48, temperature=1.0,
        learning_rate=1e-4, beta=0.001,  # TRL's KL coefficient: the guard raises it when the run hacks
        bf16=False, gradient_checkpointing=False,  # TRL's defaults (on) cost a 0.33M-parameter model ~10x on a CPU
        reward_weights=[1.0, 0.0, 0.0],  # proxy trained on; gold and hacking only logged
        logging_steps=1,  # the guard decides on each step's metrics
        save_steps=10, save_total_limit=None,  # checkpoints: the guard's rollback targets
    )
    return GRPOTrainer(model=model, reward_funcs=[proxy, gold, hacking], args=args, processing_class=tokenizer,
                       train_dataset=builtin_prompts(tokenizer, 4096, seed=seed))


def run(out: Path, *, seed: int, steps: int, guarded: bool, overrides: list[str]) -> dict:
    """Train one run; returns its held-out figures (temperature 1, 256 validation prompts) and the final beta."""
    trainer = make_trainer(out, seed=seed, steps=steps)
    if guarded:
        # (1) the guard: klguard's dotted keys; trl.gold_reward names the weight-0 gold function
        trainer.add_callback(KLGuardCallback(trainer, ["trl.gold_reward=gold", *overrides]))
    result = trainer.train()
    trainer.save_state()  # trainer_state.json at the top of `out`: what `klguard report` reads
    figures = evaluate_sampled(trainer.model, trainer.processing_class, seed=seed)
    summary = {"guarded": guarded, "seed": seed, "steps_trained": trainer.state.global_step, "final_beta": trainer.beta,
               "train_runtime_s": result.metrics["train_runtime"], **figures}
    (out / "summary.json").write_text(json.dumps(summary, indent=1) + "\n")
    return summary


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("overrides", nargs="*", help="klguard keys for the guarded run (guard.*, algorithm.kl_ctrl.*)")
    parser.add_argument("--out", type=Path, default=Path("grpo_runs"))
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--only", choices=("guarded", "unguarded"))
    args = parser.parse_args()
    torch.set_num_threads(max(1, torch.get_num_threads()))
    names = [args.only] if args.only else ["unguarded", "guarded"]
    for name in names:
        s = run(args.out / name, seed=args.seed, steps=args.steps, guarded=name == "guarded", overrides=args.overrides)
        print(f"{name:>9}: held-out gold {s['gold']:.3f}, hacking rate {s['hacking_rate']:.3f}, "
              f"length {s['response_length']:.1f} tokens, final beta {s['final_beta']:.4g}, steps {s['steps_trained']}")


if __name__ == "__main__":
    main()
