"""verl's own launch lines through `klguard train`: every script under verl's examples/ that runs
`verl.trainer.main_ppo`, with its models and data swapped for tiny local ones, as a verl user would type it.

    python benchmarks/verl_examples.py /work/.mirror/volcengine+verl/repo            # HEAD of a bare clone
    python benchmarks/verl_examples.py MIRROR --ref v0.9.0 --train                   # + 2 CPU steps per FSDP line

MIRROR is a git directory of github.com/volcengine/verl (a bare clone is enough; nothing of verl is copied into this
repository). Each script's shell variables are expanded (assignments, `${X:-default}`, `$((arithmetic))`), its
`python -m verl.trainer.main_ppo ...` arguments taken, the paths swapped: data files for a GSM8K-format parquet,
model and tokenizer paths for a tiny random Qwen2 (a vision-language model's name is kept, so the line still asks
for one), reward-model paths for a tiny Llama RM, a custom reward file for one of ours. Then
`klguard train --print-config` runs in-process and the outcome is counted: loads / a one-line refusal (with verl's
command for the plugin, or other) / a traceback (any exception escaping klguard's own error handling).

Each line is classed from its own text, apart from klguard's detection: megatron, veomni, multimodal, npu,
multi_turn, distillation, else fsdp_text. `--train` then trains every fsdp_text line that loads for 2 steps on the
CPU (batch sizes and lengths cut to fit; everything else as the line gives it) and counts trained / one-line stop /
traceback. Writes benchmarks/results/verl_examples.json.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import io
import json
import os
import re
import shlex
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
MAIN = "verl.trainer.main_ppo"
MACHINE = "2-core AMD EPYC Zen 4 (shared)"
PATH_KEYS = {"actor_rollout_ref.model.path": "policy", "critic.model.path": "policy",
             "actor_rollout_ref.model.tokenizer_path": "policy", "critic.model.tokenizer_path": "policy",
             "reward_model.model.path": "rm", "reward.reward_model.model_path": "rm",
             "reward_model.model.input_tokenizer": "policy",
             "data.train_files": "train", "data.val_files": "val", "custom_reward_function.path": "reward_file"}
# a CPU run of 2 steps in one process: the line's own settings, with batch sizes, lengths and sharding cut to fit
SMALL_RUN = ("actor_rollout_ref.actor.fsdp_config.fsdp_size=-1", "actor_rollout_ref.ref.fsdp_config.fsdp_size=-1",
             "critic.model.fsdp_config.fsdp_size=-1",
             "data.train_batch_size=4", "data.val_batch_size=null", "data.max_prompt_length=256",
             "data.max_response_length=8", "actor_rollout_ref.actor.ppo_mini_batch_size=2",
             "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=1", "critic.ppo_mini_batch_size=2",
             "critic.ppo_micro_batch_size_per_gpu=1", "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=1",
             "trainer.total_training_steps=2", "trainer.test_freq=-1", "trainer.save_freq=-1",
             "trainer.val_before_train=false", "trainer.device=cpu", "trainer.logger=[jsonl]",
             "trainer.progress_bar=false", "trainer.resume_mode=disable", "trainer.report=false")
VISION = re.compile(r"(?i)(-vl\b|-vl-|vl-|glm-4\.\dv|minicpm-o|llava|internvl|geo3k)")


# ---------------------------------------------------------------- reading the scripts
def list_scripts(mirror: Path, ref: str) -> list[str]:
    names = subprocess.run(["git", "-C", str(mirror), "ls-tree", "-r", "--name-only", ref, "examples"],
                           capture_output=True, text=True, check=True).stdout.split()
    return [n for n in names if n.endswith(".sh") and MAIN in show(mirror, ref, n)]


def show(mirror: Path, ref: str, name: str) -> str:
    return subprocess.run(["git", "-C", str(mirror), "show", f"{ref}:{name}"], capture_output=True, text=True,
                          check=True).stdout


def extract_examples(mirror: Path, ref: str, into: Path) -> None:
    """verl's examples/ tree (its Hydra configs are read by the lines that name them)."""
    archive = subprocess.run(["git", "-C", str(mirror), "archive", ref, "examples"], capture_output=True,
                             check=True).stdout
    with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
        tar.extractall(into, filter="data")


_VAR = re.compile(r"\$\(\((?P<arith>[^)]*)\)\)|\$\{(?P<braced>[A-Za-z_]\w*|\d+)(?::?[-=+](?P<default>[^}]*))?\}"
                  r"|\$(?P<plain>[A-Za-z_]\w*)")


def expand(text: str, env: dict[str, str]) -> str:
    def one(m: re.Match) -> str:
        if m.group("arith") is not None:
            expr = expand(m.group("arith"), env)
            expr = re.sub(r"\b([A-Za-z_]\w*)\b", lambda v: env.get(v.group(1), "0"), expr)
            try:
                return str(int(eval(expr, {"__builtins__": {}})))
            except Exception:
                return "0"
        name = m.group("braced") or m.group("plain")
        if name in env and env[name] != "":
            return env[name]
        return expand(m.group("default"), env) if m.group("default") is not None else env.get(name, "")
    for _ in range(4):  # nested references
        new = _VAR.sub(one, text)
        if new == text:
            break
        text = new
    return text


_ASSIGN = re.compile(r"^(?:export\s+)?([A-Za-z_]\w*)=(.*)$")


def launch_line(script: str, env: dict[str, str]) -> list[str] | None:
    """The arguments after `-m verl.trainer.main_ppo`, the script's variables expanded as bash would (mostly)."""
    lines = re.sub(r"\\\s*\n", " ", script).splitlines()
    env = dict(env)
    for raw in lines:
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        if MAIN in line:
            args = line.split(MAIN, 1)[1]
            args = re.split(r"\s(?:2>&1|\||>>?|&&|;)\s", " " + args + " ")[0]
            try:
                words = shlex.split(expand(args, env), comments=True)
            except ValueError:
                return None
            return [w for w in words if w not in ("$@", "${@}", "") and not w.startswith("$")]
        m = _ASSIGN.match(line)
        if m and "$(" not in m.group(2).replace("$((", ""):
            try:
                value = shlex.split(expand(m.group(2), env), comments=True)
            except ValueError:
                continue
            env[m.group(1)] = " ".join(value)
    return None


def split_args(words: list[str]) -> tuple[list[str], list[str]]:
    """(Hydra's --config-path/--config-name options, key=value overrides); other options dropped."""
    hydra, overrides, i = [], [], 0
    while i < len(words):
        w = words[i]
        if w.startswith(("--config-path", "--config-name", "-cp", "-cn")):
            name = "--config-path" if w.startswith(("--config-path", "-cp")) else "--config-name"
            value = w.split("=", 1)[1] if "=" in w else (words[i + 1] if i + 1 < len(words) else "")
            i += 1 if "=" in w else 2
            hydra.append(f"{name}={value.strip(chr(39) + chr(34))}")
            continue
        if "=" in w and not w.startswith("-"):
            overrides.append(w)
        i += 1
    return hydra, overrides


def line_class(name: str, words: list[str], examples: Path) -> str:
    """What the line asks for, read from its own text and the Hydra config it names."""
    config = next((w.split("=", 1)[1] for w in words if w.startswith("--config-name")), "")
    path = next((w.split("=", 1)[1] for w in words if w.startswith("--config-path")), "")
    yaml_text = ""
    for folder in (Path(path), examples / path, examples.parent / path):
        f = folder / (config if config.endswith(".yaml") else f"{config}.yaml")
        if config and f.is_file():
            yaml_text = f.read_text()
            break
    keys = " ".join(w for w in words if not w.startswith(("trainer.experiment_name", "trainer.project_name")))
    both = keys + " " + yaml_text
    if re.search(r"megatron\.|strategy=megatron|ppo_megatron_trainer|model_engine=megatron", both):
        return "megatron"
    if "veomni" in both.lower():
        return "veomni"
    if re.search(r"device=npu|profiler\.tool=npu|tool: npu", both):
        return "npu"
    if VISION.search(both):
        return "multimodal"
    if re.search(r"multi_turn\.enable=(?i:true)|multi_turn:\s*\n\s*enable: (?i:true)", both):
        return "multi_turn"
    if re.search(r"distillation\.enabled=(?i:true)", both):
        return "distillation"
    return "fsdp_text"


# ---------------------------------------------------------------- tiny assets and the swap
def build_assets(root: Path):
    spec = importlib.util.spec_from_file_location("realmodel_assets", ROOT / "tests" / "realmodel" / "conftest.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    import pyarrow as pa
    import pyarrow.parquet as pq

    train, val = mod.gsm8k_rows(16, "train"), mod.gsm8k_rows(4, "test", offset=100)
    corpus = [m["content"] for r in train + val for m in r["prompt"]] + ["#### 14 The answer is 25."] * 4
    mod.build_policy(root / "qwen2-tiny", corpus)
    mod.build_reward_model(root / "rm-tiny", corpus)
    for split, rows in (("train", train), ("val", val)):
        pq.write_table(pa.Table.from_pylist(rows), root / f"{split}.parquet")
    (root / "reward.py").write_text(mod.CUSTOM_REWARD)
    return {"policy": str(root / "qwen2-tiny"), "rm": str(root / "rm-tiny"), "train": str(root / "train.parquet"),
            "val": str(root / "val.parquet"), "reward_file": str(root / "reward.py")}


def swap(overrides: list[str], assets: dict[str, str], run_dir: Path) -> list[str]:
    out = []
    for item in overrides:
        key, value = item.split("=", 1)
        bare = key.lstrip("+")
        if bare in PATH_KEYS and not (PATH_KEYS[bare] == "policy" and VISION.search(value)):
            value = assets[PATH_KEYS[bare]]
        elif bare == "custom_reward_function.name":
            value = "compute_score"
        elif bare == "trainer.default_local_dir":
            value = str(run_dir)
        out.append(f"{key}={value}")
    keys = {o.split("=", 1)[0].lstrip("+") for o in out}
    if "data.train_files" not in keys:  # a line whose data comes from its Hydra config
        out += [f"data.train_files={assets['train']}", f"data.val_files={assets['val']}"]
    if "actor_rollout_ref.model.path" not in keys:
        out.append(f"actor_rollout_ref.model.path={assets['policy']}")
    return [*out, f"trainer.default_local_dir={run_dir}"]


# ---------------------------------------------------------------- running klguard
def print_config(hydra: list[str], overrides: list[str], cwd: Path) -> tuple[str, str]:
    """('loads' | 'plugin_line' | 'refusal' | 'traceback', the last stderr line)."""
    from klguard.commands.cli import main

    err, out = io.StringIO(), io.StringIO()
    here = Path.cwd()
    os.chdir(cwd)
    try:
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(out):
            code = main(["train", "--print-config", *hydra, *overrides])
    except SystemExit as exc:  # argparse
        code = exc.code if isinstance(exc.code, int) else 2
    except Exception as exc:
        return "traceback", f"{type(exc).__name__}: {exc}"
    finally:
        os.chdir(here)
    last = (err.getvalue().strip().splitlines() or [""])[-1]
    if code == 0:
        return "loads", last
    if code == 1 or "internal error" in last:
        return "traceback", last
    return ("plugin_line" if "trainer.v1.trainer_mode=klguard" in last else "refusal"), last


def train_two_steps(hydra: list[str], overrides: list[str], cwd: Path, timeout: int) -> tuple[str, str, float]:
    n = next((int(o.split("=", 1)[1]) for o in overrides if o.lstrip("+").startswith("actor_rollout_ref.rollout.n=")
              and o.split("=", 1)[1].isdigit()), 1)
    cmd = [sys.executable, "-m", "klguard", "train", *hydra, *overrides, *SMALL_RUN,
           f"actor_rollout_ref.rollout.n={min(n, 2)}"]
    env = os.environ | {"PYTHONPATH": str(ROOT / "src"), "OMP_NUM_THREADS": "1"}
    start = time.perf_counter()
    try:
        proc = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=timeout, env=env)
    except subprocess.TimeoutExpired:
        return "timeout", f"over {timeout} s", time.perf_counter() - start
    seconds = time.perf_counter() - start
    last = (proc.stderr.strip().splitlines() or [""])[-1]
    if proc.returncode == 0:
        return "trained", "", seconds
    if "Traceback" in proc.stderr or proc.returncode == 1:
        return "traceback", last, seconds
    return "one_line_stop", last, seconds


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("mirror", type=Path, help="git directory of github.com/volcengine/verl (bare is enough)")
    parser.add_argument("--ref", default="HEAD", help="tag or commit (default: HEAD)")
    parser.add_argument("--train", action="store_true", help="train each loading fsdp_text line 2 steps on the CPU")
    parser.add_argument("--timeout", type=int, default=900, help="seconds per training run")
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "verl_examples.json")
    args = parser.parse_args(argv)
    work = Path(tempfile.mkdtemp(prefix="verl_examples_"))
    extract_examples(args.mirror, args.ref, work)
    assets = build_assets(work / "assets")
    env = {"HOME": str(work / "home"), "PROJECT_DIR": str(work), "PWD": str(work), "CONFIG_PATH": "",
           "NNODES": "1", "NGPUS_PER_NODE": "8", "GPUS_PER_NODE": "8", "n_gpus_per_node": "8"}
    commit = subprocess.run(["git", "-C", str(args.mirror), "rev-parse", args.ref], capture_output=True, text=True,
                            check=True).stdout.strip()
    version = show(args.mirror, args.ref, "verl/version/version").strip()
    lines = {}
    for name in list_scripts(args.mirror, args.ref):
        words = launch_line(show(args.mirror, args.ref, name), env)
        if words is None:
            lines[name] = {"class": "unparsed", "outcome": "unparsed", "message": ""}
            continue
        hydra, overrides = split_args(words)
        run_dir = work / "runs" / name.replace("/", "__")
        swapped = swap(overrides, assets, run_dir)
        outcome, message = print_config(hydra, swapped, work)
        lines[name] = {"class": line_class(name, words, work / "examples"), "outcome": outcome, "message": message,
                       "args": hydra + swapped}
        print(f"{outcome:<12} {lines[name]['class']:<13} {name}  {message[:150]}", flush=True)
    if args.train:
        for name, rec in lines.items():
            if rec["class"] == "fsdp_text" and rec["outcome"] == "loads":
                hydra = [a for a in rec["args"] if a.startswith("--")]
                rest = [a for a in rec["args"] if not a.startswith("--")]
                rec["train"], rec["train_message"], rec["train_seconds"] = train_two_steps(hydra, rest, work,
                                                                                         args.timeout)
                print(f"train {rec['train']:<14} {rec['train_seconds']:6.0f}s {name}  {rec['train_message'][:150]}",
                      flush=True)
    summary = _summary(lines)
    result = {"machine": MACHINE, "mirror_ref": args.ref, "commit": commit, "verl_version": version,
              "summary": summary, "lines": lines}
    args.out.write_text(json.dumps(result, indent=1))
    print(json.dumps(summary, indent=1))
    print(f"written: {args.out}")
    return 0


def _summary(lines: dict) -> dict:
    by_class: dict[str, dict[str, int]] = {}
    for rec in lines.values():
        by_class.setdefault(rec["class"], {}).setdefault(rec["outcome"], 0)
        by_class[rec["class"]][rec["outcome"]] += 1
    trained: dict[str, int] = {}
    for rec in lines.values():
        if "train" in rec:
            trained[rec["train"]] = trained.get(rec["train"], 0) + 1
    outcomes: dict[str, int] = {}
    for rec in lines.values():
        outcomes[rec["outcome"]] = outcomes.get(rec["outcome"], 0) + 1
    return {"lines": len(lines), "outcomes": outcomes, "by_class": by_class, "fsdp_text_training": trained}


if __name__ == "__main__":
    sys.exit(main())
