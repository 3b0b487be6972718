"""Probe a real-model task (reviews or constraints) on SmolLM2-135M-Instruct: one klguard training run under verl's
default KL, every scored response recorded, then a per-step table.

    python benchmarks/real_model/probe.py --steps 80 --seed 1 --out /tmp/reviews_probe
    python benchmarks/real_model/probe.py --table-only --out /tmp/reviews_probe   # the table of a finished run
    python benchmarks/real_model/probe.py --resume --steps 80 --seed 1 --out /tmp/reviews_probe   # an unfinished one
    python benchmarks/real_model/probe.py --task constraints --steps 60 --seed 1 --out /tmp/constraints_probe

The run is `klguard train` on the task (`data.builtin_task=<task>`: klguard's own trainer, SmolLM2's GGUF as the
policy; the task's recipe in klguard.builtin.recipes sizes it) with verl's default KL (recipes.VERL_DEFAULT:
fixed 0.001, k1 in the reward, guard off; `--base shipped`: klguard's defaults, the guard on) and GRPO: groups of
`--n` responses to `--prompts` prompts a step, one optimizer step per batch. Besides metrics.jsonl,
the run directory gets samples.jsonl: every response the reward manager scored (rollouts and validation), with its
step, prompt, proxy, gold, gold's failed checks and the hacking flag; table.csv: one row per step with the
metrics NOTES.md quotes.
"""

from __future__ import annotations

import argparse
import csv
import json
import sys
from fnmatch import fnmatch
from pathlib import Path
from unittest import mock

import torch

from klguard.builtin import constraints, reviews
from klguard.builtin.recipes import TASK_RECIPES, VERL_DEFAULT
from klguard.runtime.events import truncate_logs

MODULES = {"reviews": reviews, "constraints": constraints}

COLUMNS = {
    "step": "step", "proxy": "hacking/proxy_score", "gold": "hacking/gold_score", "hack_rate": "hacking/rate",
    "val_gold": "val-core/klguard/*/acc/mean@", "val_proxy": "val-aux/klguard/*/score/mean@",
    "kl_tok": "actor/reward_kl_penalty", "kl_seq": "actor/kl_seq_sum", "entropy": "actor/entropy",
    "length": "response_length/mean", "rep3": "hacking/repeated_ngram_share", "ref_nll": "hacking/ref_nll",
    "ref_low_p": "hacking/ref_low_prob_share", "step_s": "timing_s/step",
}


def recording_manager(path: Path, val_rows: int, gold_checks):
    """klguard's RewardManager, also writing every batch it scores to `path` (JSONL, one line per response): the
    prompt, the response, the proxy, gold and gold's failed checks, the hacking flag. Batches come in the trainer's
    order (validation before training, then each step's rollouts, a validation after every `test_freq`-th step);
    a batch of `val_rows` responses is a validation, the others are training steps 1, 2, ..."""
    from klguard.reward.manager import RewardManager

    class RecordingManager(RewardManager):
        step = 0

        def __call__(self, texts, n_tokens, data_sources, ground_truths, extra_infos, prompts=None, **kw):
            out = super().__call__(texts, n_tokens, data_sources, ground_truths, extra_infos, prompts, **kw)
            is_val = len(texts) == val_rows
            if not is_val:
                RecordingManager.step += 1
            # with the proxy off the reward is gold itself (no separate gold, nothing the proxy could be hacked by)
            gold = out.scores if out.gold is None else out.gold
            hacked = torch.zeros(len(texts), dtype=torch.bool) if out.hacked is None else out.hacked
            with path.open("a") as f:
                for i, text in enumerate(texts):
                    checks = gold_checks(text, ground_truths[i])
                    f.write(json.dumps({
                        "step": RecordingManager.step, "split": "val" if is_val else "train",
                        "prompt": prompts[i][-1]["content"] if prompts else None, "item": ground_truths[i],
                        "text": text, "tokens": int(n_tokens[i]), "proxy": round(float(out.scores[i]), 4),
                        "gold": float(gold[i]), "hacked": bool(hacked[i]),
                        "failed": [k for k, v in checks.items() if not v]}, ensure_ascii=False) + "\n")
            return out

    return RecordingManager


def overrides(args: argparse.Namespace) -> list[str]:
    return [*(VERL_DEFAULT if args.base == "verl" else ()), *TASK_RECIPES[args.task],
            f"actor_rollout_ref.rollout.n={args.n}", f"data.train_batch_size={args.prompts}",
            f"actor_rollout_ref.actor.ppo_mini_batch_size={args.prompts}", f"data.max_response_length={args.tokens}",
            f"actor_rollout_ref.actor.optim.lr={args.lr}", f"trainer.total_training_steps={args.steps}",
            f"trainer.test_freq={args.test_freq}", "trainer.val_before_train=true", "trainer.save_freq=-1",
            f"actor_rollout_ref.rollout.val_kwargs.n={args.val_n}",
            f"trainer.seed={args.seed}", f"trainer.default_local_dir={args.out}", "trainer.progress_bar=false",
            "trainer.report=false",
            *(["proxy_reward.kind=learned_rm", f"proxy_reward.learned_rm.samples={args.rm_samples}",
               "reward_model.micro_batch_size_per_gpu=32"] if args.learned_rm else []),
            *args.overrides]


def write_table(run: Path) -> list[dict]:
    rows = []
    for line in (run / "metrics.jsonl").read_text().splitlines():
        rec = json.loads(line)
        if "hacking/proxy_score" not in rec:
            continue
        rows.append({col: next((v for k, v in rec.items() if fnmatch(k, key + "*")), None) if key.endswith("@")
                     else rec.get(key) for col, key in COLUMNS.items()})
    with (run / "table.csv").open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(COLUMNS))
        writer.writeheader()
        for row in rows:
            writer.writerow({k: (f"{v:.4g}" if isinstance(v, float) else v) for k, v in row.items()})
    return rows


def cut_samples(run: Path) -> int:
    """Before a resume: keep samples.jsonl's lines up to the run's latest checkpoint (the trainer cuts its own logs
    the same way), so the steps it trains again are recorded once; returns that step."""
    pointer = run / "latest_checkpointed_iteration.txt"
    if not pointer.is_file():
        sys.exit(f"{run}: no checkpoint to resume from ({pointer.name} is missing)")
    step = int(pointer.read_text())
    truncate_logs(run, step, names=("samples.jsonl",))
    return step


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, required=True, help="the run directory (made anew)")
    parser.add_argument("--steps", type=int, default=80)
    parser.add_argument("--task", choices=tuple(MODULES), default="reviews")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--lr", type=float, default=1e-5)
    parser.add_argument("--tokens", type=int, default=48, help="data.max_response_length")
    parser.add_argument("--prompts", type=int, default=8, help="data.train_batch_size")
    parser.add_argument("--n", type=int, default=4, help="rollout.n (GRPO's group)")
    parser.add_argument("--test-freq", type=int, default=5)
    parser.add_argument("--val-n", type=int, default=2, help="sampled responses per validation prompt")
    parser.add_argument("--base", choices=("verl", "shipped"), default="verl",
                        help="the KL settings the overrides start from: verl's default (recipes.VERL_DEFAULT) or "
                             "klguard's as shipped (the guarded default)")
    parser.add_argument("--learned-rm", action="store_true", help="the proxy is the task's learned RM "
                        "(klguard.builtin.probe_rm), not the task's own")
    parser.add_argument("--rm-samples", type=int, default=768, help="proxy_reward.learned_rm.samples")
    parser.add_argument("--table-only", action="store_true")
    parser.add_argument("--resume", action="store_true", help="continue an unfinished run in --out from its latest "
                        "checkpoint (klguard's trainer.resume_mode=auto), its samples.jsonl cut back to that step")
    parser.add_argument("overrides", nargs="*", help="more klguard overrides (key=value)")
    args = parser.parse_args(argv)
    if not args.table_only:
        if args.resume:
            cut_samples(args.out)
        elif args.out.exists() and any(args.out.iterdir()):
            sys.exit(f"{args.out} is not empty (--resume continues a run from its latest checkpoint)")
        args.out.mkdir(parents=True, exist_ok=True)
        from klguard.commands import cli
        from klguard.ppo import setup

        task = MODULES[args.task]
        manager = recording_manager(args.out / "samples.jsonl", len(task.make_rows("val")) * args.val_n,
                                    task.gold_checks)
        with mock.patch.object(setup, "RewardManager", manager):
            code = cli.main(["train", *overrides(args)])
        if code:
            return code
    for row in write_table(args.out):
        print("  ".join(f"{k}={v:.3f}" if isinstance(v, float) else f"{k}={v}" for k, v in row.items()
                        if v is not None))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
