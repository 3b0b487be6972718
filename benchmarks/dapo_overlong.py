"""Does DAPO's overlong reward shaping alone stop the built-in length exploit? verl's default KL (fixed beta 0.001,
k1 in the reward, no guard) plus `reward_model.reward_kwargs.overlong_buffer_cfg`, on the built-in task's length
proxy (SFT policy 0), PPO seeds 1 and 2, 200 steps each.

    python benchmarks/dapo_overlong.py                       # both buffer settings, seeds 1 and 2
    python benchmarks/dapo_overlong.py --summarize-only      # re-read the run directories

Buffers (data.max_response_length = 32 tokens, penalty_factor 1.0 as DAPO's recipe):
- `dapo_ratio`: len 6, DAPO's proportion (4096 of 20480 tokens, 20%): the penalty starts at 26 tokens.
- `half`: len 16: the penalty starts at 16 tokens, where the proxy's length bonus earns 0.5 of its 1.0.
Each run is an ordinary `klguard train` in benchmarks/results/dapo_overlong/<setting>_s<seed>/; figures as
benchmarks/hacking.py's (final and best validation gold, hacking rate and length over the last 10 steps).
Writes benchmarks/results/dapo_overlong.json; verl's default without the penalty is benchmarks/results/hacking.json's
`length/sft0/verl_default` (same settings, same seeds).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from klguard.builtin.recipes import VERL_DEFAULT
from klguard.commands.demo import fresh_run_dir
from klguard.commands.sweep import Job, default_parallel, run_jobs

sys.path.insert(0, str(Path(__file__).parent))
from hacking import _figures, _mean

KEY = "+reward_model.reward_kwargs.overlong_buffer_cfg"
SETTINGS = {
    "dapo_ratio": (f"{KEY}.enable=true", f"{KEY}.len=6", f"{KEY}.penalty_factor=1.0", f"{KEY}.log=true"),
    "half": (f"{KEY}.enable=true", f"{KEY}.len=16", f"{KEY}.penalty_factor=1.0", f"{KEY}.log=true"),
}
MACHINE = "2-core AMD EPYC Zen 4 (shared)"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--settings", nargs="+", choices=sorted(SETTINGS), default=sorted(SETTINGS))
    parser.add_argument("--seeds", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--parallel", type=int, default=default_parallel())
    parser.add_argument("--out", default=str(Path(__file__).parent / "results"))
    parser.add_argument("--summarize-only", action="store_true")
    args = parser.parse_args(argv)
    out = Path(args.out)
    jobs = [Job(f"{name}_s{seed}", out / "dapo_overlong" / f"{name}_s{seed}",
                (*VERL_DEFAULT, *SETTINGS[name], "proxy_reward.kind=length", "sft.seed=0", f"trainer.seed={seed}",
                 "trainer.resume_mode=disable"), 0)
            for name in args.settings for seed in args.seeds]
    if not args.summarize_only:
        for job in jobs:
            fresh_run_dir(job.run_dir)
        run_jobs(jobs, parallel=args.parallel, desc="dapo overlong")
    runs = {job.label: _figures(job.run_dir, job.label) for job in jobs if (job.run_dir / "summary.json").is_file()}
    means = {}
    for name in args.settings:
        rs = [v for k, v in runs.items() if k.rsplit("_s", 1)[0] == name]
        if rs:
            means[name] = {key: _mean([r[key] for r in rs]) for key in rs[0]} | {"seeds": len(rs)}
    baseline = _baseline(out / "hacking.json")
    result = {"machine": MACHINE, "settings": {n: list(SETTINGS[n]) for n in args.settings},
              "base": list(VERL_DEFAULT), "runs": runs, "means": means, "verl_default_without_penalty": baseline}
    path = out / "dapo_overlong.json"
    path.write_text(json.dumps(result, indent=1))
    for name, m in {**means, "verl_default (hacking.json)": baseline.get("mean", {})}.items():
        print(f"{name:<28} final gold {m.get('final_gold')}  hacking {m.get('hacking_rate')}  length {m.get('length')}")
    print(f"written: {path}")
    return 0


def _baseline(hacking_json: Path) -> dict:
    """verl's default without the penalty on the same cell, from the hacking benchmark's file (if there)."""
    if not hacking_json.is_file():
        return {}
    data = json.loads(hacking_json.read_text())
    runs = {k: v for k, v in data.get("runs", {}).items() if k.startswith("length/sft0/verl_default_s")}
    return {"runs": runs, "mean": data.get("means", {}).get("length/sft0", {}).get("verl_default", {})}


if __name__ == "__main__":
    sys.exit(main())
