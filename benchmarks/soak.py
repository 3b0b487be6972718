"""Kill-and-resume soak test: SIGKILL `klguard train` at random moments, resume, repeat; then finish.

Each cycle starts `python -m klguard train` (trainer.resume_mode=auto) on a small demo run that
checkpoints every step, SIGKILLs it after a random delay (during start-up, a step or a checkpoint
write), then checks every published `global_step_N/` against its manifest. Reported: steps redone
(logged before the kill but after the newest whole checkpoint; at most save_freq per cycle is the
target), checkpoints ever unreadable (target: never), and whether the finished run's `metrics.jsonl`
equals an uninterrupted run's (timing_s/* and perf/* aside). Writes `benchmarks/results/soak.json`.

    python benchmarks/soak.py [--cycles 50] [--steps 40] [--seed 0] [--workdir DIR]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from klguard.runtime.checkpoint import CheckpointManager, verify_checkpoint

SAVE_FREQ = 1
IGNORED = ("timing_s/", "perf/")


def overrides(run: Path, cache: Path, steps: int) -> list[str]:
    return [f"trainer.default_local_dir={run}", f"sft.cache_dir={cache}", "sft.steps=30", "sft.eval_every=30",
            "trainer.progress_bar=false", "trainer.logger=[jsonl]", "data.builtin_train_size=64",
            "data.builtin_val_size=16", "data.train_batch_size=16", "data.max_response_length=16",
            "actor_rollout_ref.actor.ppo_mini_batch_size=8", f"trainer.save_freq={SAVE_FREQ}",
            "trainer.test_freq=-1", "trainer.val_before_train=false", f"trainer.total_training_steps={steps}"]


def train(args: list[str], env: dict[str, str]) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "klguard", "train", *args], env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def logged_steps(run: Path) -> list[int]:
    path = run / "metrics.jsonl"
    if not path.is_file():
        return []
    steps = []
    for line in path.read_text().splitlines():
        with contextlib.suppress(ValueError, KeyError):  # a line torn by the kill
            steps.append(json.loads(line)["step"])
    return steps


def comparable(run: Path) -> list[dict]:
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    return [{k: v for k, v in r.items() if not k.startswith(IGNORED)} for r in rows]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cycles", type=int, default=50)
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--max-delay", type=float, default=8.0, help="longest run before a kill, seconds")
    parser.add_argument("--workdir", type=Path, default=None)
    args = parser.parse_args()
    rng = random.Random(args.seed)
    root = args.workdir or Path(tempfile.mkdtemp(prefix="klguard-soak-"))
    run, straight, cache = root / "run", root / "straight", root / "sft-cache"
    env = dict(os.environ, OMP_NUM_THREADS=os.environ.get("OMP_NUM_THREADS", "1"))
    if subprocess.run([sys.executable, "-m", "klguard", "train", *overrides(straight, cache, args.steps)],
                      env=env, capture_output=True).returncode != 0:
        sys.exit("the uninterrupted run failed")

    redone, unreadable, beyond_target, kills = 0, 0, 0, 0
    for _ in range(args.cycles):
        proc = train(overrides(run, cache, args.steps), env)
        try:
            proc.wait(rng.uniform(0.5, args.max_delay))
        except subprocess.TimeoutExpired:
            proc.send_signal(signal.SIGKILL)
            proc.wait()
            kills += 1
        manager = CheckpointManager(run, warn=lambda msg: None)
        bad = [s for s in manager.steps() if verify_checkpoint(manager.path(s)) is not None]
        unreadable += len(bad)
        latest = manager.latest()
        saved = int(latest.name.rsplit("_", 1)[1]) if latest else 0
        done = max(logged_steps(run), default=0)
        redone += max(0, done - saved)
        beyond_target += max(0, done - saved - SAVE_FREQ)
        if proc.returncode == 0:
            break  # finished before the kill came
    finished = subprocess.run([sys.executable, "-m", "klguard", "train", *overrides(run, cache, args.steps)],
                              env=env, capture_output=True).returncode == 0
    result = {
        "cycles": args.cycles, "kills": kills, "steps": args.steps, "save_freq": SAVE_FREQ,
        "steps_redone_total": redone, "steps_lost_beyond_last_checkpoint": beyond_target,
        "unreadable_checkpoints": unreadable, "finished": finished,
        "metrics_equal_uninterrupted": finished and comparable(run) == comparable(straight),
        "when": time.strftime("%Y-%m-%d %H:%M:%S"),
    }
    out = Path(__file__).parent / "results" / "soak.json"
    out.parent.mkdir(exist_ok=True)
    out.write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
