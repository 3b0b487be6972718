"""KLGuardCallback in TRL's GRPOTrainer: its own cost, and the built-in hacking task guarded vs unguarded.

    pip install -e '.[trl]'
    python benchmarks/trl_guard.py                  # seeds 1 2, 200 steps each run (about 7 min on 2 cores)
    python benchmarks/trl_guard.py --seeds 1 --steps 50

Each run is examples/trl/grpo_guarded.py's (64 completions a step, beta 0.001, lr 1e-4, a checkpoint every 10 steps).
Cost: the time spent inside the callback's hooks (decisions, events, and the rollbacks' checkpoint loads, counted
apart) per step of the guarded run, over the mean step time of the unguarded run of the same seed (the anchor:
TRL alone). Quality: held-out gold, hacking rate and response length at temperature 1 on 256 validation prompts,
and the final beta. Writes benchmarks/results/trl_guard.json.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import platform
import statistics
import time
from functools import wraps
from pathlib import Path

from klguard.integrations.trl import KLGuardCallback
from klguard.integrations.trl.callback import TRLHost

ROOT = Path(__file__).resolve().parents[1]
HOOKS = ("on_train_begin", "on_log", "on_save", "state")
ROLLBACK = ("restore_checkpoint", "restore_reference", "reanchor_reference")  # TRLHost's loads of saved weights


def _example():
    spec = importlib.util.spec_from_file_location("grpo_guarded", ROOT / "examples" / "trl" / "grpo_guarded.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class HookTimer:
    """Wall time inside the callback's hooks, and inside its rollbacks' weight loads (part of on_log) apart."""

    def __init__(self) -> None:
        self.total = self.rollbacks = 0.0

    def install(self) -> None:
        for name in HOOKS:
            setattr(KLGuardCallback, name, self._timed(getattr(KLGuardCallback, name), "total"))
        for name in ROLLBACK:
            setattr(TRLHost, name, self._timed(getattr(TRLHost, name), "rollbacks"))

    def _timed(self, method, bucket: str):
        @wraps(method)
        def timed(*args, **kwargs):
            start = time.perf_counter()
            try:
                return method(*args, **kwargs)
            finally:
                setattr(self, bucket, getattr(self, bucket) + time.perf_counter() - start)
        return timed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "trl_guard")
    parser.add_argument("--json", type=Path, default=ROOT / "benchmarks" / "results" / "trl_guard.json")
    args = parser.parse_args()
    example, timer = _example(), HookTimer()
    timer.install()
    runs = []
    for seed in args.seeds:
        unguarded = example.run(args.out / f"unguarded_s{seed}", seed=seed, steps=args.steps, guarded=False,
                                overrides=[])
        timer.total = timer.rollbacks = 0.0
        guarded = example.run(args.out / f"guarded_s{seed}", seed=seed, steps=args.steps, guarded=True, overrides=[])
        step_s = unguarded["train_runtime_s"] / unguarded["steps_trained"]
        per_step = (timer.total - timer.rollbacks) / guarded["steps_trained"]
        guarded |= {"callback_s_per_step": per_step, "rollback_s_total": timer.rollbacks,
                    "callback_share_of_trl_step": per_step / step_s}
        runs += [unguarded, guarded]
        print(f"seed {seed}: TRL step {step_s * 1e3:.1f} ms; callback {per_step * 1e3:.3f} ms a step "
              f"({per_step / step_s:.2%}), rollbacks {timer.rollbacks:.2f} s in all")
    print(f"\n{'run':<12}{'seed':>5}{'gold':>8}{'hacking':>9}{'length':>8}{'beta':>8}{'steps':>7}")
    for r in runs:
        name = "guarded" if r["guarded"] else "unguarded"
        print(f"{name:<12}{r['seed']:>5}{r['gold']:>8.3f}{r['hacking_rate']:>9.3f}{r['response_length']:>8.1f}"
              f"{r['final_beta']:>8.3g}{r['steps_trained']:>7}")
    shares = [r["callback_share_of_trl_step"] for r in runs if r["guarded"]]
    result = {"machine": {"cpu": platform.processor() or platform.machine(), "python": platform.python_version()},
              "steps": args.steps, "runs": runs, "callback_share_of_trl_step_median": statistics.median(shares)}
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(result, indent=1) + "\n")
    print(f"\ncallback cost: {statistics.median(shares):.2%} of a TRL step (median over seeds); wrote {args.json}")


if __name__ == "__main__":
    main()
