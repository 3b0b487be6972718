"""verl's own launch lines through `klguard train`: every script under verl's examples/ that runs
`verl.trainer.main_ppo`, with its models and data swapped for tiny local ones, as a verl user would type it.

    python benchmarks/verl_examples.py MIRROR --ref v0.9.0            # a tag of a bare clone
    python benchmarks/verl_examples.py MIRROR                          # its HEAD; --train: + 2 CPU steps per FSDP line

MIRROR is a git directory of github.com/verl-project/verl (a bare clone is enough; nothing of verl is copied into
this repository). Each script runs in bash from a copy of the ref's examples/, its launcher (`python3`, `uv run`)
caught as a shell function, so its arrays, `case`s and defaults are bash's own; the arguments after
`verl.trainer.main_ppo` are taken and the paths swapped: data files for a GSM8K-format parquet, model and tokenizer
paths for a tiny random Qwen2 (a vision-language model's name is kept, so the line still asks for one), reward-model
paths for a tiny Llama RM, a custom reward file for one of ours. Then `klguard train --print-config` runs in-process
and the outcome is counted: loads / a one-line refusal (with verl's command for the plugin, or other) / a traceback
(any exception escaping klguard's own error handling) / unparsed (the script ends before its launch).

Each line is classed from its own text, apart from klguard's detection: megatron, veomni, another engine
(mindspeed, megatron_lite, ...), npu, multimodal, multi_turn, distillation, else fsdp_text. `--train` then trains
every fsdp_text line that loads for 2 steps on the CPU (batch sizes and lengths cut to fit; everything else as the
line gives it) and counts trained / one-line stop / traceback. Writes the run, keyed by its ref, into
benchmarks/results/verl_examples.json (the other refs' runs stay).
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import io
import json
import os
import re
import shutil
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
             "data.train_files": "train", "data.val_files": "val", "custom_reward_function.path": "reward_file",
             "reward.custom_reward_function.path": "reward_file"}
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
# vision-language models and image data; Qwen3.5 checkpoints have a vision tower (transformers' Qwen3_5Config)
VISION = re.compile(r"(?i)(-vl\b|-vl-|vl-|glm-4\.\dv|minicpm-o|llava|internvl|geo3k|qwen3[._]5)")


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


# Each script runs in bash as a user would run it (arrays, `case`, `if`, `$(...)`, defaults), with `python`, `python3`,
# `uv` and `torchrun` as shell functions: the first call whose arguments hold verl's entry point writes them and
# ends the script; any other call does nothing (`python3 -c ...`, an import probe, fails, as on a machine without
# Ascend's torch_npu; `ulimit` does nothing). PATH holds only the tools below, so nothing else (downloads, installs)
# runs; HOME and the working folder are a temporary folder. A variable the script requires of its user (bash's
# "unbound variable" under `set -u`, or `${X:?message}`) is set, empty or to a placeholder folder, and the script
# run again.
TOOLS = ("mkdir", "cat", "dirname", "basename", "date", "tee", "seq", "nproc", "hostname", "realpath", "readlink",
         "head", "tail", "tr", "sed", "awk", "grep", "cut", "wc", "expr", "env", "true", "false", "printf", "ls",
         "pwd", "id", "whoami", "uname", "bc")
SHIMS = r"""
_verl_launch() {
  local i
  for ((i = 1; i <= $#; i++)); do
    if [[ "${!i}" == verl.trainer.main_ppo* ]]; then
      [ -e "$VERL_ARGS" ] || printf '%s\0' "${@:i}" > "$VERL_ARGS"
      exit 0
    fi
  done
  [ "${1:-}" != -c ]
}
python() { _verl_launch "$@"; }
python3() { _verl_launch "$@"; }
uv() { _verl_launch "$@"; }
torchrun() { _verl_launch "$@"; }
hf() { :; }
huggingface-cli() { :; }
ulimit() { :; }
source "$0"
"""
_REQUIRED = re.compile(r"line \d+: ([A-Za-z_]\w*): (.*)$")


def launch_line(script: str | Path, env: dict[str, str], cwd: Path | None = None
                ) -> tuple[list[str] | None, dict[str, str]]:
    """(the entry point and its arguments, `verl.trainer.main_ppo...` then the words after it, as bash gives them to
    the script's launch, or None where the script ends without one; the variables set for it). `script`: its text,
    or its file."""
    with tempfile.TemporaryDirectory(prefix="verl_line_") as tmp:
        tmp_dir = Path(tmp)
        tools = tmp_dir / "bin"
        tools.mkdir()
        for tool in TOOLS:
            found = shutil.which(tool)
            if found:
                (tools / tool).symlink_to(found)
        if not isinstance(script, Path):
            (tmp_dir / "script.sh").write_text(script)
            script = tmp_dir / "script.sh"
        out, given = tmp_dir / "args", {}
        for _ in range(8):
            run_env = {"HOME": str(tmp_dir), "PWD": str(cwd or tmp_dir), **env, **given, "PATH": str(tools),
                       "VERL_ARGS": str(out)}
            try:
                proc = subprocess.run(["/bin/bash", "-c", SHIMS, str(script)], cwd=cwd or tmp_dir, env=run_env,
                                      capture_output=True, text=True, timeout=60)
            except subprocess.TimeoutExpired:
                return None, given
            if out.is_file():
                return out.read_text().split("\0")[:-1], given
            last = (proc.stderr.strip().splitlines() or [""])[-1]
            required = _REQUIRED.search(last)
            if required is None or required.group(1) in given:
                return None, given
            name = required.group(1)
            given[name] = "" if required.group(2) == "unbound variable" else f"{cwd or tmp_dir}/user/{name.lower()}"
        return None, given


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
    engine = re.search(r"model_engine=(\w+)|strategy=(torchtitan|automodel|mindspeed)\b", both)
    if engine and (engine.group(1) or engine.group(2)) not in ("fsdp", "fsdp2", "dp"):
        return engine.group(1) or engine.group(2)
    choice = re.search(r"@\S+=\w*?(mlite|torchtitan|automodel|mindspeed)", keys)  # `actor@...=mlite_actor`
    if choice:
        return {"mlite": "megatron_lite"}.get(choice.group(1), choice.group(1))
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
        elif bare in ("custom_reward_function.name", "reward.custom_reward_function.name"):
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
    parser.add_argument("mirror", type=Path, help="git directory of github.com/verl-project/verl (bare is enough)")
    parser.add_argument("--ref", default="HEAD", help="tag or commit (default: HEAD)")
    parser.add_argument("--train", action="store_true", help="train each loading fsdp_text line 2 steps on the CPU")
    parser.add_argument("--timeout", type=int, default=900, help="seconds per training run")
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "verl_examples.json")
    args = parser.parse_args(argv)
    work = Path(tempfile.mkdtemp(prefix="verl_examples_"))
    extract_examples(args.mirror, args.ref, work)
    assets = build_assets(work / "assets")
    env = {"HOME": str(work / "home"), "PROJECT_DIR": str(work), "PWD": str(work), "CONFIG_PATH": ""}
    commit = subprocess.run(["git", "-C", str(args.mirror), "rev-parse", args.ref], capture_output=True, text=True,
                            check=True).stdout.strip()
    version = show(args.mirror, args.ref, "verl/version/version").strip()
    commit_date = subprocess.run(["git", "-C", str(args.mirror), "log", "-1", "--format=%cs", args.ref],
                                 capture_output=True, text=True, check=True).stdout.strip()
    klguard_commit = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], capture_output=True,
                                    text=True).stdout.strip()
    lines = {}
    for name in list_scripts(args.mirror, args.ref):
        words, given = launch_line(work / name, env, cwd=work)
        if words is None:
            lines[name] = {"class": "unparsed", "outcome": "unparsed", "message": "", "variables_set": given}
            continue
        entry, words = words[0], words[1:]
        hydra, overrides = split_args(words)
        run_dir = work / "runs" / name.replace("/", "__")
        swapped = swap(overrides, assets, run_dir)
        outcome, message = print_config(hydra, swapped, work)
        lines[name] = {"class": line_class(name, words, work / "examples"), "outcome": outcome, "message": message,
                       "entry": entry, "variables_set": given, "args": hydra + swapped}
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
    lines = json.loads(json.dumps(lines).replace(str(work), "$WORK"))  # the temporary folder, named once
    run = {"machine": MACHINE, "command": " ".join(["python benchmarks/verl_examples.py MIRROR", *argv_shown(args)]),
           "ref": args.ref, "commit": commit, "commit_date": commit_date, "verl_version": version,
           "klguard_commit": klguard_commit, "summary": summary, "lines": lines}
    result = json.loads(args.out.read_text()) if args.out.is_file() else {}
    result = {"runs": {**result.get("runs", {}), args.ref: run}}  # one run per ref: the tag and the newest snapshot
    args.out.write_text(json.dumps(result, indent=1))
    print(json.dumps(summary, indent=1))
    print(f"written: {args.out} (runs: {', '.join(result['runs'])})")
    return 0


def argv_shown(args) -> list[str]:
    return [f"--ref {args.ref}"] + (["--train"] if args.train else [])


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
