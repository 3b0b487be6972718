"""Throughput of klguard against Hugging Face TRL, side by side on this machine.

    python benchmarks/throughput.py            # everything (creates the TRL venv on the first run)
    python benchmarks/throughput.py --quick    # 1 warm-up + 3 steps, scaling on the tiny workload only

On 2 cores shared with other jobs (load 7) a small-workload step took 35-55 s instead of a few
seconds, so budget by the machine's load; --only and --no-bf16 run a subset.

Workloads: random-init Llamas with klguard's character vocabulary, built locally (nothing is
downloaded but TRL's pip packages): *small* (hidden 384, 6 layers, 6 heads, intermediate 1024) and
*tiny* (hidden 128, 2 layers, 4 heads, intermediate 256). Every step: 64 rollouts of arithmetic
prompts (`Q:23+45-7=?A:`), exactly 32 sampled tokens each, one PPO epoch, one mini-batch, 2 threads per
contender (--threads; the committed results: 1, beside another 1-thread job on the 2 cores).

Pairings, equal work (see throughput_klguard.py and throughput_trl.py for the settings):
- ppo_rm: klguard PPO (actor, critic, reference, a reward model of the same size, KL in the reward)
  vs `trl.experimental.ppo.PPOTrainer` (trl==1.12.0) with value and reward models of the same size;
  fp32, and bf16 on the small workload where the CPU has bf16 instructions;
- grpo: klguard GRPO with the KL loss (0.04, k3) vs `trl.GRPOTrainer` with beta=0.04, 16 prompts x 4;
- ppo_rule: klguard PPO with the rule reward instead of the reward model (TRL's PPO cannot take one).
Every pairing runs klguard twice: with its default eager decode loop (`klguard`), and with
`actor_rollout_ref.rollout.enforce_eager=false` (`klguard-compiled`: the decode step compiled over a
static KV cache; the compile happens in the warm-up steps); --no-compiled leaves the second out. TRL
runs with its defaults (no torch_compile, generation through `model.generate` with a dynamic cache).

Each contender is a worker process (klguard in this interpreter, TRL in benchmarks/.venv-trl) that
stops after every step until the driver releases it; the contenders of a pairing are released in
turn, A B A B ..., so both see the same load. Figures: median seconds per step after the warm-up
steps, generated tokens/s, the share of each phase, peak RSS, the speedup (TRL s / klguard s), and
a ceiling: the FLOPs klguard's step does (2N per token for a forward, 6N for forward+backward, N the
matmul parameters of each model involved, attention ignored: under 3% here; a group's shared prompt
counts once, see step_flops) over the best matmul FLOP/s this machine showed in the same run (measured
at the start, before each setting and at the end); efficiency = ceiling time / measured time. Scaling: klguard
PPO step time at response lengths 32/64/128 and at 32/64/128 rollouts a step.

Writes benchmarks/results/throughput.json and prints a table.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import torch
import transformers

from klguard.runtime.profiling import window_folder

BENCH = Path(__file__).resolve().parent
WORK = BENCH / ".work" / "throughput"
VENV = BENCH / ".venv-trl"
REQUIREMENTS = BENCH / "requirements-trl.txt"
RESULTS = BENCH / "results" / "throughput.json"

WORKLOADS = {
    "small": {"hidden_size": 384, "num_layers": 6, "num_heads": 6, "intermediate_size": 1024},
    "tiny": {"hidden_size": 128, "num_layers": 2, "num_heads": 4, "intermediate_size": 256},
}
MAX_POSITIONS = 256  # prompts of ~13 characters plus up to 128 sampled tokens
ROLLOUTS, GROUP, RESPONSE_LENGTH = 64, 4, 32
PHASES = ("gen", "old_logprob", "ref", "values", "reward", "update", "other")
COMPILED = "klguard-compiled"  # klguard with actor_rollout_ref.rollout.enforce_eager=false


# ----------------------------------------------------------------------------- the ceiling
@dataclass(frozen=True)
class Work:
    """What one step computes: rollouts x tokens per sequence through which models."""

    algo: str  # ppo | grpo
    reward: str  # model | rule
    n_policy: int  # matmul parameters of the policy (= reference)
    n_value: int  # of the critic (policy body + a one-output head)
    n_rm: int  # of the reward model
    rollouts: int
    prompt_tokens: float  # per sequence
    response_tokens: float
    group: int = 1  # rollouts per prompt; klguard runs a group's prompt once in every policy/critic forward

    @property
    def policy_tokens(self) -> float:
        """Tokens per rollout through the policy, reference and critic: a group's prompt counts once."""
        return self.prompt_tokens / self.group + self.response_tokens


def step_flops(w: Work) -> dict[str, float]:
    """FLOPs per phase of one step as klguard runs it: a forward costs 2N per token, a forward and
    backward 6N. The old log-probs come from the sampling forwards, and the critic's values from its
    update's forward (one epoch, one mini-batch: klguard.ppo.update.critic_values_in_update), so neither
    costs an extra pass: the critic's 6N is split as 2N in `values` and 4N (the backward) in `update`.
    The reward model reads every rollout whole (it re-renders prompt and response with its own template)."""
    per_token = w.rollouts * w.policy_tokens
    flops = {"gen": 2 * w.n_policy * per_token, "ref": 2 * w.n_policy * per_token, "values": 0.0, "reward": 0.0,
             "update": 6 * w.n_policy * per_token}  # ref: KL in the reward (ppo) or the KL loss (grpo)
    if w.algo == "ppo":
        flops["values"] = 2 * w.n_value * per_token
        flops["update"] += 4 * w.n_value * per_token  # the critic's backward
    if w.reward == "model":
        flops["reward"] = 2 * w.n_rm * w.rollouts * (w.prompt_tokens + w.response_tokens)
    return flops


def matmul_params(model: torch.nn.Module) -> int:
    """Weights that take part in matrix products (every nn.Linear); the embedding lookup does not."""
    return sum(m.weight.numel() for m in model.modules() if isinstance(m, torch.nn.Linear))


def matmul_flops_per_s(dtype: torch.dtype, repeats: int = 5) -> dict[str, float]:
    """Best sustained torch.mm FLOP/s over a square and the small model's MLP shape (median of repeats)."""
    out = {}
    for m, k, n in ((2048, 1024, 1024), (ROLLOUTS * 45, 384, 1024)):
        a, b = torch.randn(m, k, dtype=dtype), torch.randn(k, n, dtype=dtype)
        times = []
        for _ in range(repeats + 1):
            started = time.perf_counter()
            for _ in range(4):
                torch.mm(a, b)
            times.append((time.perf_counter() - started) / 4)
        out[f"{m}x{k}x{n}"] = 2 * m * k * n / statistics.median(times[1:])
    return out


def cpu_bf16() -> dict[str, object]:
    flags = next((line.split(":", 1)[1].split() for line in Path("/proc/cpuinfo").read_text().splitlines()
                  if line.startswith("flags")), [])
    found = sorted(f for f in flags if f in ("avx512_bf16", "amx_bf16", "amx_tile"))
    return {"mkldnn": torch.backends.mkldnn.is_available(), "cpu_flags": found, "available": bool(found)}


# ----------------------------------------------------------------------------- assets
def build_assets(work: Path) -> dict:
    """Policy and reward-model folders for each workload, and the arithmetic task's parquet files."""
    from transformers import LlamaForSequenceClassification

    from klguard.builtin.arith import write_arith_parquet
    from klguard.builtin.char_tokenizer import build_char_tokenizer
    from klguard.builtin.tiny import build_tiny_llama, save_hf_folder, tiny_llama_config

    transformers.utils.logging.disable_progress_bar()
    tokenizer = build_char_tokenizer()
    train, val = write_arith_parquet(work / "data", 4096, 64, seed=1)
    assets: dict = {"train": str(train), "val": str(val), "workloads": {}}
    for name, arch in WORKLOADS.items():
        arch = {**arch, "max_position_embeddings": MAX_POSITIONS}
        policy = build_tiny_llama(tokenizer, seed=0, **arch)
        save_hf_folder(policy, tokenizer, work / name / "policy")
        config = tiny_llama_config(tokenizer, **arch)
        config.num_labels = 1
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(1)
            rm = LlamaForSequenceClassification(config)
        rm.save_pretrained(work / name / "rm")
        tokenizer.save_pretrained(work / name / "rm")
        body = matmul_params(policy) - matmul_params(policy.lm_head)
        assets["workloads"][name] = {
            "policy": str(work / name / "policy"), "rm": str(work / name / "rm"), **arch,
            "params": sum(p.numel() for p in policy.parameters()), "n_policy": matmul_params(policy),
            "n_value": body + config.hidden_size, "n_rm": matmul_params(rm)}
    import pyarrow.parquet as pq

    lengths = [len(tokenizer.apply_chat_template(row["prompt"], add_generation_prompt=True, tokenize=False))
               for row in pq.read_table(train).to_pylist()]  # one token per character
    assets["prompt_tokens_mean"] = statistics.fmean(lengths)
    return assets


LIBRARIES = ("torch", "transformers", "trl", "accelerate", "datasets", "kernels")


def pinned(requirements: Path = REQUIREMENTS) -> dict[str, str]:
    """name -> version of every `name==version` line of requirements-trl.txt."""
    out = {}
    for line in requirements.read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if "==" in line:
            name, version = line.split("==", 1)
            out[name.strip().lower()] = version.strip()
    return out


def installed_versions(python: str | Path, names: tuple[str, ...] = LIBRARIES) -> dict[str, str | None]:
    """The versions `python` has of `names` (None where absent), read with importlib.metadata."""
    code = ("import json, sys, importlib.metadata as m\n"
            "def v(n):\n    try:\n        return m.version(n)\n"
            "    except m.PackageNotFoundError:\n        return None\n"
            "print(json.dumps({n: v(n) for n in sys.argv[1:]}))")
    done = subprocess.run([str(python), "-c", code, *names], capture_output=True, text=True)
    return json.loads(done.stdout) if done.returncode == 0 else {}


def venv_matches(found: dict[str, str | None], pins: dict[str, str]) -> bool:
    """Whether every pinned package is installed at its pinned version (torch's local tag, +cpu, ignored)."""
    return all((found.get(name) or "").split("+", 1)[0] == version for name, version in pins.items())


def ensure_trl_venv() -> Path:
    """benchmarks/.venv-trl at requirements-trl.txt's pins (torch the CPU build, TRL and the rest from PyPI);
    a venv whose versions differ from the pins is brought to them."""
    python = VENV / "bin" / "python"
    pins = pinned()
    if python.exists() and venv_matches(installed_versions(python, tuple(pins)), pins):
        return python
    print(f"installing {REQUIREMENTS.name} into {VENV} (once; a few minutes)", flush=True)
    if not python.exists():
        subprocess.run([sys.executable, "-m", "venv", str(VENV)], check=True)
    log = WORK / "pip-trl.log"
    with open(log, "w") as out:
        done = subprocess.run([str(python), "-m", "pip", "install", "-r", str(REQUIREMENTS)], stdout=out,
                              stderr=subprocess.STDOUT)
    if done.returncode != 0 or not venv_matches(installed_versions(python, tuple(pins)), pins):
        raise SystemExit(f"installing TRL failed; see {log}")
    return python


# ----------------------------------------------------------------------------- workers
class WorkerError(RuntimeError):
    pass


class Worker:
    """One contender's process; it reports each step and waits for `go`."""

    def __init__(self, name: str, python: str, script: str, spec: dict, threads: int) -> None:
        self.name, self.spec = name, spec
        self.log = Path(spec["run_dir"]).with_suffix(".log")
        self.log.parent.mkdir(parents=True, exist_ok=True)
        env = {**os.environ, "OMP_NUM_THREADS": str(threads), "MKL_NUM_THREADS": str(threads),
               "TOKENIZERS_PARALLELISM": "false", "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1",
               "TRANSFORMERS_OFFLINE": "1", "WANDB_DISABLED": "true", "HF_HUB_DISABLE_PROGRESS_BARS": "1"}
        with open(self.log, "w") as err:
            self.proc = subprocess.Popen([python, str(BENCH / script), json.dumps(spec)], stdin=subprocess.PIPE,
                                         stdout=subprocess.PIPE, stderr=err, text=True, env=env, cwd=BENCH.parent)
        self.steps: list[dict] = []
        self.final: dict = {}

    def read(self, expected: str) -> dict:
        line = self.proc.stdout.readline()
        if not line:
            tail = "\n".join(self.log.read_text().splitlines()[-30:])
            raise WorkerError(f"{self.name} worker exited (code {self.proc.wait()}); {self.log}:\n{tail}")
        event = json.loads(line)
        if event["event"] != expected:
            raise WorkerError(f"{self.name}: expected {expected}, got {event}")
        return event

    def send(self, command: str) -> None:
        self.proc.stdin.write(command + "\n")
        self.proc.stdin.flush()

    def step(self) -> None:
        self.send("go")
        self.steps.append(self.read("step"))

    def stop(self) -> None:
        self.send("stop")
        self.final = self.read("final")
        self.proc.wait()


def run_alternating(workers: list[Worker], rounds: int) -> list[float]:
    """Release the (ready) workers in turn, A B A B ..., then stop them; returns the 1-minute load
    average after each round."""
    load = []
    for i in range(rounds):
        for w in workers:
            w.step()
        load.append(float(loadavg().split()[0]))
        print(f"    step {i + 1}/{rounds}: " + ", ".join(f"{w.name} {w.steps[-1]['wall_s']:.2f} s" for w in workers)
              + f" (load {load[-1]:.1f})", flush=True)
    for w in workers:
        w.stop()
    return load


def summarise(w: Worker, warmup: int, rollouts: int, response_length: int) -> dict:
    measured = w.steps[warmup:]
    wall = [s["wall_s"] for s in measured]
    median = statistics.median(wall)
    phases = {p: statistics.median(s["phases"].get(p, 0.0) for s in measured) for p in PHASES if p != "other"}
    phases["other"] = max(0.0, median - sum(phases.values()))
    out = {"s_per_step": median, "s_per_step_all": wall, "warmup_s": [s["wall_s"] for s in w.steps[:warmup]],
           "cpu_s_per_step": statistics.median(s["cpu_s"] for s in measured),
           "tokens_per_s": rollouts * response_length / median, "phase_s": phases,
           "phase_share": {p: v / median for p, v in phases.items()}, "peak_rss_mib": w.final["peak_rss_mib"]}
    if "guard_s" in measured[0]:
        out["guard_s"] = statistics.median(s["guard_s"] for s in measured)
        out["response_length_mean"] = statistics.fmean(s["response_length"] for s in measured)
    return out


# ----------------------------------------------------------------------------- the runs
@dataclass(frozen=True)
class Setting:
    name: str
    algo: str
    reward: str
    dtype: str
    with_trl: bool


def settings(bf16: bool) -> list[tuple[str, Setting]]:
    """fp32 pairings of both workloads first, then bf16 (small workload, where the CPU has it)."""
    out = [(workload, s) for workload in WORKLOADS for s in (
        Setting("ppo_rm", "ppo", "model", "fp32", True), Setting("grpo", "grpo", "rule", "fp32", True),
        Setting("ppo_rule", "ppo", "rule", "fp32", False))]
    if bf16:
        out.append(("small", Setting("ppo_rm", "ppo", "model", "bf16", True)))
    return out


def make_spec(assets: dict, workload: str, s: Setting, contender: str, *, rollouts: int, response_length: int,
              max_steps: int, threads: int) -> dict:
    folders = assets["workloads"][workload]
    tag = f"{workload}_{s.name}_{s.dtype}_{contender}_b{rollouts}_r{response_length}"
    return {"algo": s.algo, "reward": s.reward, "dtype": s.dtype, "policy": folders["policy"], "rm": folders["rm"],
            "train": assets["train"], "val": assets["val"], "rollouts": rollouts,
            "n": GROUP if s.algo == "grpo" else 1, "response_length": response_length, "max_steps": max_steps + 5,
            "threads": threads, "seed": 1, "run_dir": str(WORK / "runs" / tag)}


def ceiling(assets: dict, workload: str, s: Setting, peak: dict[str, float], rollouts: int,
            response_length: int) -> dict:
    folders = assets["workloads"][workload]
    work = Work(s.algo, s.reward, folders["n_policy"], folders["n_value"], folders["n_rm"], rollouts,
                assets["prompt_tokens_mean"], response_length, GROUP if s.algo == "grpo" else 1)
    flops = step_flops(work)
    total = sum(flops.values())
    return {"flops": total, "flops_by_phase": flops, "ceiling_s": total / peak[s.dtype]}


def run_setting(args, assets: dict, trl_python: str | None, workload: str, s: Setting, peak: dict[str, float], *,
                rollouts: int = ROLLOUTS, response_length: int = RESPONSE_LENGTH, warmup: int, steps: int,
                compiled: bool = False) -> dict:
    contenders = [("klguard", sys.executable, "throughput_klguard.py")]
    if compiled:  # klguard again with rollout.enforce_eager=false (the decode step compiled)
        contenders.append((COMPILED, sys.executable, "throughput_klguard.py"))
    if s.with_trl and trl_python is not None:
        contenders.append(("trl", trl_python, "throughput_trl.py"))
    started = time.perf_counter()
    result = {"workload": workload, "setting": s.name, "algo": s.algo, "reward": s.reward, "dtype": s.dtype,
              "rollouts": rollouts, "response_length": response_length, "warmup": warmup, "steps": steps,
              **ceiling(assets, workload, s, peak, rollouts, response_length), "contenders": {}}
    workers: list[Worker] = []
    try:
        for name, python, script in contenders:  # one start-up at a time: they would compete for the cores
            spec = make_spec(assets, workload, s, name, rollouts=rollouts, response_length=response_length,
                             max_steps=warmup + steps, threads=args.threads)
            spec["compile_decode"] = name == COMPILED
            if args.profile and script == "throughput_klguard.py":  # the last warm-up step: medians untouched
                spec["profile_step"] = warmup
            workers.append(Worker(name, python, script, spec, args.threads))
            workers[-1].read("ready")
        result["load_1min_per_round"] = run_alternating(workers, warmup + steps)
    except WorkerError as exc:  # reported, and the other settings still run
        for w in workers:
            w.proc.kill()
        print(f"  failed: {exc}", flush=True)
        return {**result, "error": str(exc)}
    for w in workers:
        summary = summarise(w, warmup, rollouts, response_length)
        summary["efficiency"] = result["ceiling_s"] / summary["s_per_step"]
        if w.spec.get("profile_step"):
            summary["profile"] = str(window_folder(Path(w.spec["run_dir"]) / "profile", warmup) / "rank0.txt")
            print(f"  {w.name}: operators of warm-up step {warmup} by self CPU time: {summary['profile']}", flush=True)
        result["contenders"][w.name] = summary
    if "trl" in result["contenders"]:  # TRL s / klguard s, for each klguard contender
        theirs = result["contenders"]["trl"]["s_per_step"]
        result["speedup_vs_trl"] = {name: theirs / c["s_per_step"] for name, c in result["contenders"].items()
                                    if name != "trl"}
    result["elapsed_s"] = time.perf_counter() - started
    return result


def run_scaling(args, assets: dict, peak: dict[str, float], workload: str, warmup: int, steps: int) -> dict:
    s = Setting("ppo_rm", "ppo", "model", "fp32", False)
    points = [(ROLLOUTS, r) for r in (32, 64, 128)] + [(b, RESPONSE_LENGTH) for b in (32, 128)]
    runs = []
    for rollouts, length in points:
        print(f"  scaling {workload}: {rollouts} rollouts x {length} tokens", flush=True)
        r = run_setting(args, assets, None, workload, s, peak, rollouts=rollouts, response_length=length,
                        warmup=warmup, steps=steps)
        if "error" in r:
            continue
        k = r["contenders"]["klguard"]
        runs.append({"rollouts": rollouts, "response_length": length, "s_per_step": k["s_per_step"],
                     "tokens_per_s": k["tokens_per_s"], "flops": r["flops"], "ceiling_s": r["ceiling_s"],
                     "efficiency": k["efficiency"],
                     "phase_share": k["phase_share"]})
    base = next((p for p in runs if (p["rollouts"], p["response_length"]) == (ROLLOUTS, RESPONSE_LENGTH)), None)
    for p in runs if base else []:
        p["time_vs_base"] = p["s_per_step"] / base["s_per_step"]
        p["work_vs_base"] = p["ceiling_s"] / base["ceiling_s"]
    return {"workload": workload, "setting": "klguard ppo_rm fp32", "warmup": warmup, "steps": steps, "points": runs}


# ----------------------------------------------------------------------------- report
def table(results: list[dict]) -> str:
    head = (f"{'workload':<8}{'setting':<10}{'dtype':<6}{'contender':<17}{'s/step':>8}{'tok/s':>8}"
            + "".join(f"{p[:6]:>7}" for p in PHASES)
            + f"{'RSS MiB':>9}{'ceil s':>8}{'eff':>7}{'guard':>7}{'speedup':>9}")
    lines = [head, "-" * len(head)]
    for r in results:
        if "error" in r:
            lines.append(f"{r['workload']:<8}{r['setting']:<10}{r['dtype']:<6}failed: {r['error'].splitlines()[0]}")
        for name, c in r["contenders"].items():
            speedup = r.get("speedup_vs_trl", {}).get(name)
            speedup = f"{speedup:.2f}x" if speedup else ""
            lines.append(f"{r['workload']:<8}{r['setting']:<10}{r['dtype']:<6}{name:<17}{c['s_per_step']:>8.3f}"
                         f"{c['tokens_per_s']:>8.0f}" + "".join(f"{100 * c['phase_share'][p]:>6.0f}%" for p in PHASES)
                         + f"{c['peak_rss_mib']:>9.0f}{r['ceiling_s']:>8.3f}{100 * c['efficiency']:>6.0f}%"
                         + (f"{100 * c['guard_s'] / c['s_per_step']:>6.2f}%" if "guard_s" in c else f"{'':>7}")
                         + f"{speedup:>9}")
    return "\n".join(lines)


def scaling_table(scaling: dict) -> str:
    lines = [f"scaling ({scaling['workload']}, {scaling['setting']}): rollouts x tokens -> s/step "
             "(x base time, x base FLOPs, efficiency)"]
    for p in scaling["points"]:
        if "time_vs_base" not in p:
            continue
        lines.append(f"  {p['rollouts']:>4} x {p['response_length']:>4}: {p['s_per_step']:7.3f} s  "
                     f"(x{p['time_vs_base']:.2f} time, x{p['work_vs_base']:.2f} work, {100 * p['efficiency']:.0f}%)")
    return "\n".join(lines)


def measure_peak(peak: dict[str, float], report: dict, dtype: str) -> None:
    """Measure the matmul rate again (before each setting) and keep the best seen: a rate measured while the
    CPU was slower would understate the ceiling and flatter every efficiency."""
    measured = matmul_flops_per_s(torch.float32 if dtype == "fp32" else torch.bfloat16)
    report["matmul_flops_per_s"].setdefault("before_settings", []).append({dtype: measured})
    peak[dtype] = max(peak[dtype], *measured.values())


def rescale_ceilings(results: list[dict], scaling: dict | None, peak: dict[str, float]) -> None:
    """Ceilings and efficiencies from the best matmul rate of the whole run (the FLOPs do not change)."""
    for r in results + (scaling["points"] if scaling else []):
        dtype = r.get("dtype", "fp32")
        r["ceiling_s"] = r["flops"] / peak[dtype]
        for c in r.get("contenders", {}).values():
            c["efficiency"] = r["ceiling_s"] / c["s_per_step"]
        if "efficiency" in r:
            r["efficiency"] = r["ceiling_s"] / r["s_per_step"]


def loadavg() -> str:
    return Path("/proc/loadavg").read_text().strip()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="1 warm-up + 3 steps, scaling on the tiny workload")
    ap.add_argument("--warmup", type=int, default=None, help="warm-up steps per contender (default 2)")
    ap.add_argument("--steps", type=int, default=None, help="measured steps per contender (default 8)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--only", nargs="*", default=None, help="workload or workload/setting, e.g. tiny small/grpo")
    ap.add_argument("--no-trl", action="store_true", help="klguard only (no TRL venv)")
    ap.add_argument("--no-scaling", action="store_true")
    ap.add_argument("--no-bf16", action="store_true", help="skip the bf16 pairing")
    ap.add_argument("--no-compiled", action="store_true",
                    help=f"skip the {COMPILED} contender (rollout.enforce_eager=false)")
    ap.add_argument("--profile", action="store_true",
                    help="trace klguard's last warm-up step with torch.profiler (global_profiler.tool=torch)")
    ap.add_argument("--out", type=Path, default=RESULTS)
    args = ap.parse_args(argv)
    warmup = args.warmup if args.warmup is not None else (1 if args.quick else 2)
    steps = args.steps if args.steps is not None else (3 if args.quick else 8)
    torch.set_num_threads(args.threads)
    started = time.perf_counter()
    load_start = loadavg()
    print(f"load at start: {load_start}", flush=True)
    WORK.mkdir(parents=True, exist_ok=True)
    trl_python = None if args.no_trl else str(ensure_trl_venv())
    assets = build_assets(WORK)
    bf16 = cpu_bf16()
    mm_start = {"fp32": matmul_flops_per_s(torch.float32), "bf16": matmul_flops_per_s(torch.bfloat16)}
    peak = {k: max(v.values()) for k, v in mm_start.items()}
    print(f"matmul peak, {args.threads} threads: fp32 {peak['fp32'] / 1e9:.1f} GFLOP/s, "
          f"bf16 {peak['bf16'] / 1e9:.1f} GFLOP/s; bf16 instructions: {bf16['cpu_flags'] or 'none'}", flush=True)

    results: list[dict] = []
    report = {
        "command": " ".join(["python", "benchmarks/throughput.py", *(argv if argv is not None else sys.argv[1:])]),
        "machine": {"cpu_count": os.cpu_count(), "threads": args.threads, "platform": platform.platform(),
                    "python": platform.python_version(), "torch": torch.__version__,
                    "transformers": transformers.__version__, "bf16": bf16},
        # each contender's libraries: klguard runs in this interpreter, TRL in benchmarks/.venv-trl
        "libraries": {"klguard": installed_versions(sys.executable),
                      "trl": installed_versions(trl_python) if trl_python else None},
        "load_start": load_start, "matmul_flops_per_s": {"start": mm_start, "peak_used": peak},
        "workloads": assets["workloads"], "prompt_tokens_mean": assets["prompt_tokens_mean"],
        "warmup": warmup, "steps": steps, "results": results, "scaling": None, "complete": False,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)

    def save() -> None:  # after every setting: a run cut short still leaves its figures
        report.update(load_end=loadavg(), elapsed_s=time.perf_counter() - started)
        args.out.write_text(json.dumps(report, indent=1) + "\n")

    for workload, s in settings(bf16["available"] and not args.no_bf16):
        if args.only and workload not in args.only and f"{workload}/{s.name}" not in args.only:
            continue
        print(f"{workload} {s.name} {s.dtype}: klguard{' vs TRL' if s.with_trl and trl_python else ''}", flush=True)
        measure_peak(peak, report, s.dtype)
        results.append(run_setting(args, assets, trl_python, workload, s, peak, warmup=warmup, steps=steps,
                                   compiled=not args.no_compiled))
        save()
    if not args.no_scaling:
        report["scaling"] = run_scaling(args, assets, peak, "tiny" if args.quick else "small", 1,
                                        2 if args.quick else 3)
    report["matmul_flops_per_s"]["end"] = {"fp32": matmul_flops_per_s(torch.float32),
                                           "bf16": matmul_flops_per_s(torch.bfloat16)}
    for dtype, measured in report["matmul_flops_per_s"]["end"].items():
        peak[dtype] = max(peak[dtype], *measured.values())
    rescale_ceilings(results, report["scaling"], peak)
    report["complete"] = True
    save()
    scaling = report["scaling"]
    print()
    print(table(results))
    if scaling:
        print(scaling_table(scaling))
    for side, versions in report["libraries"].items():
        if versions:
            print(f"{side}: " + ", ".join(f"{k} {v}" for k, v in versions.items() if v))
    print(f"\nload: start {load_start} | end {report['load_end']}; {report['elapsed_s'] / 60:.1f} min; "
          f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
