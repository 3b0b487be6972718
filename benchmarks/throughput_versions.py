"""The throughput benchmark's small PPO + reward-model pairing with each contender in an interpreter of your choosing:
does a library version move klguard's or TRL's step time?

    python benchmarks/throughput_versions.py --steps 5 klguard=.venv-test/bin/python \\
        trl-5.25=benchmarks/.venv-trl/bin/python trl-5.24=/tmp/venv-trl-524/bin/python

A name starting with `klguard` runs benchmarks/throughput_klguard.py (that interpreter needs klguard importable),
any other benchmarks/throughput_trl.py (trl 1.12 with trl.experimental.ppo). The setting is throughput.py's
`small ppo_rm fp32` (64 rollouts, 32 tokens, one epoch, one mini-batch), the contenders released in turn, A B A B,
after one warm-up step each. Appends the run (medians, phases, peak RSS, each interpreter's library versions, the load
average per round) to benchmarks/results/throughput_versions.json and prints it.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch
from throughput import (
    RESULTS,
    WORK,
    Setting,
    Worker,
    build_assets,
    installed_versions,
    loadavg,
    make_spec,
    run_alternating,
    summarise,
)

OUT = RESULTS.with_name("throughput_versions.json")
ROLLOUTS, LENGTH = 64, 32


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("contenders", nargs="+", help="NAME=PYTHON, e.g. trl-5.24=/tmp/venv/bin/python")
    ap.add_argument("--steps", type=int, default=5, help="measured steps per contender (after 1 warm-up)")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--out", type=Path, default=OUT)
    args = ap.parse_args(argv)
    pythons = dict(c.split("=", 1) for c in args.contenders)
    torch.set_num_threads(args.threads)
    WORK.mkdir(parents=True, exist_ok=True)
    assets = build_assets(WORK)
    setting = Setting("ppo_rm", "ppo", "model", "fp32", True)
    load_start, workers = loadavg(), []
    for name, python in pythons.items():
        script = "throughput_klguard.py" if name.startswith("klguard") else "throughput_trl.py"
        spec = make_spec(assets, "small", setting, name, rollouts=ROLLOUTS, response_length=LENGTH,
                         max_steps=1 + args.steps, threads=args.threads)
        workers.append(Worker(name, python, script, spec, args.threads))
        workers[-1].read("ready")
    load = run_alternating(workers, 1 + args.steps)
    run = {"command": " ".join(["python", "benchmarks/throughput_versions.py", *(argv or sys.argv[1:])]),
           "setting": "small ppo_rm fp32", "threads_per_contender": args.threads, "warmup": 1, "steps": args.steps,
           "load_start": load_start, "load_1min_per_round": load, "contenders": {}}
    for w in workers:
        run["contenders"][w.name] = {**summarise(w, 1, ROLLOUTS, LENGTH),
                                     "libraries": installed_versions(pythons[w.name])}
    runs = json.loads(args.out.read_text())["runs"] if args.out.exists() else []
    args.out.write_text(json.dumps({"runs": [*runs, run]}, indent=1) + "\n")
    for name, c in run["contenders"].items():
        libs = ", ".join(f"{k} {v}" for k, v in c["libraries"].items() if v)
        print(f"{name:<16}{c['s_per_step']:>7.2f} s/step  update {c['phase_s']['update']:.2f} s  other "
              f"{c['phase_s']['other']:.2f} s  peak RSS {c['peak_rss_mib']:.0f} MiB  ({libs})")
    print(f"load {load_start} -> {loadavg()}; {time.strftime('%H:%M')}; wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
