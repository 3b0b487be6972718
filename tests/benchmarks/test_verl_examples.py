"""benchmarks/verl_examples.py's reading of a launch script (scripts written for this test): run in bash with the
launchers as shell functions, the arguments after the entry point taken (arrays, `case`, `uv run`, variables the
script requires of its user), Hydra's options apart, paths swapped, the line classed."""

from __future__ import annotations

import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parents[2] / "benchmarks"
sys.path.insert(0, str(BENCH))

import verl_examples as ve  # noqa: E402

SCRIPT = """#!/bin/bash
set -x
# a comment with verl.trainer.main_ppo in it is not the line
gsm8k_train_path=$HOME/data/gsm8k/train.parquet
TP=${1:-4}
max_response_length=$((1024 * 2))
export MODEL_PATH=${MODEL_PATH:-"Qwen/Qwen2.5-7B-Instruct"}
train_files="['$gsm8k_train_path']"

python3 -m verl.trainer.main_ppo --config-path=config \\
    --config-name='ppo_trainer.yaml' \\
    data.train_files="$train_files" \\
    data.max_response_length=${max_response_length} \\
    actor_rollout_ref.model.path=$MODEL_PATH \\
    actor_rollout_ref.rollout.tensor_model_parallel_size=$TP \\
    trainer.logger='["console","wandb"]' \\
    trainer.experiment_name=qwen_megatron_free $@ 2>&1 | tee log.txt
"""


ARRAYS = """#!/usr/bin/env bash
set -xeuo pipefail
DEVICE=${DEVICE:-$(python3 -c 'import torch_npu' 2>/dev/null && echo npu || echo gpu)}
NAME=${NAME:-run_${BACKEND}}
MODEL_PATH=${MODEL_PATH:-"${DATA_HOME}/models/Qwen3-8B"}
: "${ADAPTER:?must set ADAPTER}"
ulimit -n 65535
python3 examples/data_preprocess/gsm8k.py --local_save_dir "$HOME/data"
DATA=(
    data.train_files="['a.parquet', 'b.parquet']"
    data.max_prompt_length=$((1024 * 2))
)
TRAINER=(trainer.experiment_name=${NAME})
case "${DEVICE}" in
    npu) TRAINER+=(trainer.device=npu) ;;
    gpu) TRAINER+=(trainer.n_gpus_per_node=8) ;;
esac
LAUNCH=(uv run --frozen python3)
"${LAUNCH[@]}" -m verl.trainer.main_ppo "${DATA[@]}" "${TRAINER[@]}" \
    actor_rollout_ref.model.path="$MODEL_PATH" +lora.adapter="$ADAPTER" "$@" 2>&1 | tee log.txt
echo "not reached"
"""


def test_a_script_becomes_its_launch_line():
    words, given = ve.launch_line(SCRIPT, {"HOME": "/home/u"})
    assert words[0] == "verl.trainer.main_ppo" and given == {}
    hydra, overrides = ve.split_args(words[1:])
    assert hydra == ["--config-path=config", "--config-name=ppo_trainer.yaml"]
    assert overrides == ["data.train_files=['/home/u/data/gsm8k/train.parquet']", "data.max_response_length=2048",
                         "actor_rollout_ref.model.path=Qwen/Qwen2.5-7B-Instruct",
                         "actor_rollout_ref.rollout.tensor_model_parallel_size=4",
                         'trainer.logger=["console","wandb"]', "trainer.experiment_name=qwen_megatron_free"]
    assert ve.line_class("x.sh", words, Path("/nowhere")) == "fsdp_text"  # a name is not an engine


def test_arrays_case_uv_and_the_variables_a_script_requires():
    words, given = ve.launch_line(ARRAYS, {})
    assert words[0] == "verl.trainer.main_ppo"
    assert set(given) == {"BACKEND", "DATA_HOME", "ADAPTER"}  # unbound under set -u: empty; ${X:?}: a folder
    assert given["BACKEND"] == given["DATA_HOME"] == "" and given["ADAPTER"].endswith("/user/adapter")
    assert words[1:] == ["data.train_files=['a.parquet', 'b.parquet']", "data.max_prompt_length=2048",
                         "trainer.experiment_name=run_", "trainer.n_gpus_per_node=8",
                         "actor_rollout_ref.model.path=/models/Qwen3-8B", f"+lora.adapter={given['ADAPTER']}"]


def test_a_script_without_a_launch_gives_none():
    assert ve.launch_line("echo hello\nexit 1\n", {}) == (None, {})


def test_paths_are_swapped_and_a_vision_model_kept(tmp_path):
    assets = {"policy": "/a/policy", "rm": "/a/rm", "train": "/a/train.parquet", "val": "/a/val.parquet",
              "reward_file": "/a/reward.py"}
    out = ve.swap(["data.train_files=['x', 'y']", "+critic.model.path=Qwen/Qwen2-7B",
                   "actor_rollout_ref.model.path=Qwen/Qwen2.5-VL-7B-Instruct"], assets, tmp_path)
    assert out[:3] == ["data.train_files=/a/train.parquet", "+critic.model.path=/a/policy",
                       "actor_rollout_ref.model.path=Qwen/Qwen2.5-VL-7B-Instruct"]
    assert out[3:] == [f"trainer.default_local_dir={tmp_path}"]  # the line's own data and model keys were there


def test_lines_are_classed_by_what_they_ask_for():
    assert ve.line_class("a.sh", ["actor_rollout_ref.actor.megatron.tensor_model_parallel_size=2"], Path(".")) \
        == "megatron"
    assert ve.line_class("a.sh", ["actor_rollout_ref.rollout.multi_turn.enable=True"], Path(".")) == "multi_turn"
    assert ve.line_class("a.sh", ["global_profiler.tool=npu"], Path(".")) == "npu"
    assert ve.line_class("a.sh", ["actor_rollout_ref.model.path=Qwen/Qwen2.5-VL-3B"], Path(".")) == "multimodal"
    assert ve.line_class("a.sh", ["actor_rollout_ref.model.path=Qwen/Qwen3.5-27B"], Path(".")) == "multimodal"
    assert ve.line_class("a.sh", ["model_engine=mindspeed"], Path(".")) == "mindspeed"
    assert ve.line_class("a.sh", ["model_engine=dp"], Path(".")) == "fsdp_text"
    assert ve.line_class("a.sh", ["actor@actor_rollout_ref.actor=mlite_actor"], Path(".")) == "megatron_lite"
