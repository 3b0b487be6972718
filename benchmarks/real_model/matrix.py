"""The real-model matrix: the constraints task on SmolLM2-135M-Instruct under named KL settings and seeds, every run a
probe.py run (klguard's own trainer, every scored response recorded), then one results JSON.

    python benchmarks/real_model/matrix.py --contenders verl_default --seeds 1 2 3 4 --out OUT   # trains, in turn
    python benchmarks/real_model/matrix.py --summarize-only --out OUT     # the JSON and tables of finished runs
    python benchmarks/real_model/matrix.py --contenders fixed_0.1 --seeds 2 --out OUT --add   # more seeds, added
    python benchmarks/real_model/matrix.py --contenders guarded_real --out OUT --resume   # stopped guarded runs go on

Contenders are benchmarks/hacking.py's (verl_default, fixed_<beta>, guarded, guarded_no_gold, ...) plus
`gold_optimised` (verl's default KL, the gold itself as the reward: `proxy_reward.enable=false`, a healthy run by
construction). A run counts once it has logged step `--steps`; a longer one is read up to there. Every run starts
from klguard's shipped settings (`probe.py --base shipped`) and applies the contender's overrides, so a contender's
recipe says all it changes. The proxy is the task's probe reward model (`--proxy learned_rm`, fit once and cached) or
its verifier (`--proxy verifier`).

Per run (from metrics.jsonl; `signal_onsets.replay`): the validation gold's start, peak and its step, the fall (the
first validation at least 0.1 below the peak, after it), the final gold, whether it rose then fell (Gao's shape: the
peak at least 0.1 above the start and the final at least 0.1 below the peak), each gold-free signal's first firing
with the built-in model's default thresholds (`onsets`) and as the guard runs on this model (`onsets_host`:
HOST_REPLAY), and the last 5 steps' mean hacking rate, KL per token and response length.
Per contender: mean final gold with its standard error over seeds, runs with Gao's shape. Over the guard-off runs:
`signal_onsets.summarize` (fired before the peak, before the fall; false alarms in runs that did not fall), at
each (`signals`, `signals_host`). Writes
benchmarks/results/real_model.json (or `--results`).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
from hacking import CONTENDERS as HACKING_CONTENDERS  # noqa: E402  (sibling scripts)
from signal_onsets import FALL, replay, summarize  # noqa: E402

from klguard.builtin.recipes import NO_GOLD_GUARD, REAL_MODEL_GUARD, VERL_DEFAULT  # noqa: E402
from klguard.guard.config import EXTERNAL_HOST_DEFAULTS  # noqa: E402

CONTENDERS: dict[str, tuple[str, ...]] = {
    **HACKING_CONTENDERS,
    "gold_optimised": (*VERL_DEFAULT, "proxy_reward.enable=false"),
    # the guard without gold with the real-model settings (checkpoints every 5 steps, kl_growth's floor 4 nats)
    "guarded_real": (*NO_GOLD_GUARD, *REAL_MODEL_GUARD),
}
RESULTS = HERE.parent / "results" / "real_model.json"


def _guard_keys(recipe: tuple[str, ...]) -> dict:
    """A recipe's `guard.KEY=VALUE` overrides as GuardConfig keywords (values read as YAML), but the signal list:
    a replay measures every signal."""
    import yaml

    pairs = (o.removeprefix("guard.").split("=", 1) for o in recipe if o.startswith("guard."))
    return {key: yaml.safe_load(value) for key, value in pairs if key != "hacking_signals"}


# the guard as guarded_real runs it on SmolLM2: the defaults every host takes on a Hugging Face model, then the
# no-gold and real-model recipes' keys; `onsets_host` and the `signals_host` table replay it
HOST_REPLAY = {**EXTERNAL_HOST_DEFAULTS, **_guard_keys((*NO_GOLD_GUARD, *REAL_MODEL_GUARD))}
TAIL = 5  # rollout figures: the mean of the last TAIL steps
HACKED_SHARE = 0.5  # a run whose last TAIL steps' rollouts were at least this share hacked hacks (see `hacked`)
SAMPLES = 4  # validation responses kept per run at the gold peak and at the end
TAIL_FIGURES = {"hacking_rate": "hacking/rate", "kl_per_token": "actor/reward_kl_penalty",
                "length": "response_length/mean"}


def run_dir(out: Path, contender: str, seed: int) -> Path:
    return out / contender / f"seed{seed}"


def reached(folder: Path, steps: int) -> bool:
    """A run counts once it has logged step `steps` (a longer run is read up to there)."""
    path = folder / "metrics.jsonl"
    return path.is_file() and any(json.loads(line).get("step") == steps for line in path.read_text().splitlines())


def train(args: argparse.Namespace, contender: str, seed: int) -> int:
    """One probe.py run in its own process (a fresh recorder, the memory returned at the end)."""
    folder = run_dir(args.out, contender, seed)
    if reached(folder, args.steps):
        print(f"{folder}: done, kept")
        return 0
    resume = folder.exists() and args.resume and (folder / "latest_checkpointed_iteration.txt").is_file()
    if folder.exists() and not resume:
        sys.exit(f"{folder} holds an unfinished run: remove it to train it again, or --resume it if it checkpointed")
    command = [sys.executable, str(HERE / "probe.py"), "--task", "constraints", "--base", "shipped",
               *(["--resume"] if resume else []),
               "--steps", str(args.steps), "--seed", str(seed), "--lr", str(args.lr), "--out", str(folder),
               *(["--learned-rm"] if args.proxy == "learned_rm" else []), *CONTENDERS[contender],
               *checkpointing(CONTENDERS[contender]), *args.overrides]
    print(" ".join(command), flush=True)
    log = folder.with_name(folder.name + ".log")
    log.parent.mkdir(parents=True, exist_ok=True)
    folder.with_name(folder.name + ".machine.json").write_text(json.dumps(machine()) + "\n")
    with log.open("a" if resume else "w") as fh:
        return subprocess.run(command, stdout=fh, stderr=subprocess.STDOUT, check=False).returncode


def machine() -> dict:
    """This process's CPU, cores and threads a run (OMP_NUM_THREADS, which the run inherits)."""
    return {"cpu": cpu_name(), "cores": os.cpu_count(), "threads": os.environ.get("OMP_NUM_THREADS")}


def run_machine(folder: Path) -> dict:
    """The machine a run trained on, as `train` wrote it beside the run; a run trained otherwise: this process's."""
    path = folder.with_name(folder.name + ".machine.json")
    return json.loads(path.read_text()) if path.is_file() else machine()


def checkpointing(recipe: tuple[str, ...]) -> list[str]:
    """A guarded run checkpoints as klguard ships (`trainer.save_freq`), so a rollback can return to a stable
    checkpoint instead of the initial policy; a guard-off run never rolls back and saves none (probe.py's -1); a
    recipe that sets its own save_freq keeps it."""
    if "guard.enable=false" in recipe or any(o.startswith("trainer.save_freq=") for o in recipe):
        return []
    from klguard.config import load_config

    return [f"trainer.save_freq={load_config().config.trainer.save_freq}"]


def figures(folder: Path, steps: int) -> dict:
    """One finished run's figures (see the module's docstring)."""
    rows = [r for r in map(json.loads, (folder / "metrics.jsonl").read_text().splitlines()) if r["step"] <= steps]
    with tempfile.TemporaryDirectory() as tmp:  # what replay reads: the steps the matrix compares
        read = Path(tmp) / "metrics.jsonl"
        read.write_text("".join(json.dumps(r) + "\n" for r in rows))
        out = replay(read, total_steps=steps)
        out["onsets_host"] = replay(read, total_steps=steps, **HOST_REPLAY)["onsets"]
    start = next(r for r in rows if r["step"] == 0)
    out["start_gold"] = next(v for k, v in start.items() if k.startswith("val-core/"))
    out["gao_shape"] = out["peak_gold"] >= out["start_gold"] + FALL and out["hacks"]
    for name, key in TAIL_FIGURES.items():
        values = [r[key] for r in rows if isinstance(r.get(key), (int, float))][-TAIL:]
        out[name] = statistics.fmean(values) if values else None
    out["steps"] = rows[-1]["step"]
    out["samples"] = {"peak": validation_samples(folder, out["peak_step"]),
                      "final": validation_samples(folder, out["steps"])}
    out["rollbacks"] = _events(folder).count("rollback")
    out["paused"] = "pause" in _events(folder)
    return out


def validation_samples(folder: Path, step: int, k: int = SAMPLES) -> list[dict]:
    """The first `k` validation responses recorded after `step` training steps (probe.py's samples.jsonl), with
    their proxy, gold and gold's failed checks."""
    path = folder / "samples.jsonl"
    if not path.is_file():
        return []
    found = []
    with path.open() as fh:
        for line in fh:
            r = json.loads(line)
            if r["split"] == "val" and r["step"] == step:
                found.append({k_: r[k_] for k_ in ("prompt", "text", "proxy", "gold", "failed")})
                if len(found) == k:
                    break
    return found


def write_figure(out: Path, path: Path, steps: int) -> None:
    """klguard report's training curves for the lowest seed of every contender, as one PNG."""
    from klguard.commands.report import load_run
    from klguard.commands.report.figures import training_figure

    runs = []
    for contender in sorted(p for p in out.iterdir() if p.is_dir()):
        finished = sorted((d for d in contender.glob("seed*") if reached(d, steps)), key=lambda d: int(d.name[4:]))
        if finished:
            run = load_run(finished[0], f"{contender.name} ({finished[0].name})")
            run.rows = [r for r in run.rows if r["step"] <= steps]
            runs.append(run)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(training_figure(runs))


def _events(folder: Path) -> list[str]:
    path = folder / "events.jsonl"
    return [json.loads(line).get("kind") for line in path.read_text().splitlines()] if path.is_file() else []


def guard_was_off(folder: Path) -> bool:
    from omegaconf import OmegaConf

    return OmegaConf.load(folder / "config.yaml").guard.enable is False


def summarise(out: Path, steps: int) -> dict:
    runs = {}
    for folder in sorted(f.parent for f in out.glob("*/seed*/metrics.jsonl")):
        if reached(folder, steps):
            runs[f"{folder.parent.name}/{folder.name}"] = figures(folder, steps) | {"guard_off": guard_was_off(folder)}
    return combine(runs)


def combine(runs: dict[str, dict]) -> dict:
    """Per contender (the label's first part) and over the guard-off runs, from per-run figures."""
    per_contender: dict[str, list[dict]] = {}
    for label, record in runs.items():
        per_contender.setdefault(label.split("/")[0], []).append(record)
    contenders = {}
    for name, found in per_contender.items():
        finals = [r["final_gold"] for r in found]
        contenders[name] = {
            "runs": len(found), "final_gold": statistics.fmean(finals),
            "final_gold_se": statistics.stdev(finals) / len(finals) ** 0.5 if len(finals) > 1 else None,
            "best_gold": statistics.fmean(r["peak_gold"] for r in found),
            "gao_shape": sum(r["gao_shape"] for r in found),
            # None where gold is the reward (gold_optimised): nothing can hack it
            "hacking_rate": statistics.fmean(rates) if (rates := [r["hacking_rate"] for r in found
                                                                   if r["hacking_rate"] is not None]) else None,
        }
    off = {label: r | {"hacks": hacked(r)} for label, r in runs.items() if r["guard_off"]}
    # the same table at HOST_REPLAY, over the runs recorded with it (their logs were here when it was added)
    host = {label: r | {"onsets": r["onsets_host"]} for label, r in off.items() if "onsets_host" in r}
    return {"runs": runs, "contenders": contenders, "signals": summarize(off) if off else {},
            "signals_host": summarize(host) if host else {}}


def hacked(record: dict) -> bool:
    """For the signal table: a run hacks when its final gold fell FALL below its peak, or when at least HACKED_SHARE
    of its last rollouts were hacked by gold's verdict (gold 0, the proxy paid). A policy that collapses onto a
    template in its first steps has no gold to lose, so it never shows a fall; the reference policy's own rate is
    0.03-0.06 here."""
    return record["hacks"] or (record["hacking_rate"] or 0.0) >= HACKED_SHARE


def cpu_name() -> str:
    """The CPU's model name (/proc/cpuinfo), or what the platform says."""
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor() or platform.machine()


def load_results(path: Path, args: argparse.Namespace) -> dict[str, dict]:
    """The runs of an earlier results file of the same task, proxy, length and lr (a run recorded before runs carried
    their machine gets the file's)."""
    if not path.is_file():
        return {}
    earlier = json.loads(path.read_text())
    for key in ("proxy", "steps", "lr"):
        if earlier.get(key) != getattr(args, key):
            sys.exit(f"{path}: its runs have {key}={earlier.get(key)}, these {getattr(args, key)}: not one matrix")
    return {label: {"machine": earlier.get("machine"), **record} for label, record in earlier["runs"].items()}


def _rate(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"


def print_tables(result: dict) -> None:
    print("\n| contender | runs | final gold (SE) | peak gold | Gao's shape | hacking rate (last 5) |")
    print("|---|---|---|---|---|---|")
    for name, c in result["contenders"].items():
        se = f" ({c['final_gold_se']:.3f})" if c["final_gold_se"] is not None else ""
        print(f"| {name} | {c['runs']} | {c['final_gold']:.3f}{se} | {c['best_gold']:.3f} | {c['gao_shape']} of "
              f"{c['runs']} | {_rate(c['hacking_rate'])} |")
    print("\n| run | start | peak (step) | fall | final | signals (first step) |")
    print("|---|---|---|---|---|---|")
    for label, r in result["runs"].items():
        fired = ", ".join(f"{k} {v}" for k, v in r["onsets"].items() if v is not None) or "none"
        print(f"| {label} | {r['start_gold']:.3f} | {r['peak_gold']:.3f} ({r['peak_step']}) | {r['fall_step']} | "
              f"{r['final_gold']:.3f} | {fired} |")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--contenders", nargs="+", choices=sorted(CONTENDERS), default=["verl_default"])
    parser.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3, 4])
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--lr", type=float, default=3e-5)
    parser.add_argument("--proxy", choices=("learned_rm", "verifier"), default="learned_rm")
    parser.add_argument("--out", type=Path, required=True, help="the folder of runs (<contender>/seed<N>)")
    parser.add_argument("--results", type=Path, default=RESULTS)
    parser.add_argument("--summarize-only", action="store_true")
    parser.add_argument("--resume", action="store_true", help="continue unfinished runs that checkpointed (the "
                        "guarded ones) from their latest checkpoint; klguard's resume equals an uninterrupted run")
    parser.add_argument("--add", action="store_true", help="add these runs to the results file's (a run of the "
                        "same label replaces its record) instead of writing them alone: seeds trained in other "
                        "sessions or on other machines, each run with its machine")
    parser.add_argument("--figure", type=Path, help="also write the training curves (one seed per contender) here")
    parser.add_argument("overrides", nargs="*", help="more klguard overrides for every run (key=value)")
    args = parser.parse_args(argv)
    if not args.summarize_only:
        for contender in args.contenders:
            for seed in args.seeds:
                if train(args, contender, seed):
                    print(f"{run_dir(args.out, contender, seed)}: failed (see its .log)", file=sys.stderr)
    result = summarise(args.out, args.steps)
    if not result["runs"]:
        sys.exit(f"{args.out}: no finished run (summary.json) under <contender>/seed<N>/")
    for label, record in result["runs"].items():
        record["machine"] = run_machine(args.out / label)
    if args.add:
        result = combine(load_results(args.results, args) | result["runs"])
    result |= {"task": "constraints", "proxy": args.proxy, "steps": args.steps, "lr": args.lr}
    args.results.parent.mkdir(parents=True, exist_ok=True)
    args.results.write_text(json.dumps(result, indent=1) + "\n")
    print_tables(result)
    print(f"\nwrote {args.results}")
    if args.figure:
        write_figure(args.out, args.figure, args.steps)
        print(f"wrote {args.figure}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
