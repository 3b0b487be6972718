#!/usr/bin/env bash
# GPU check of the verl plugin (issue 19): a tiny Qwen2 GRPO run through verl 0.9.1 with vLLM, trainer mode
# klguard, a forced blow-up (a hard KL limit no step can meet) and the guard's rollback, in a few minutes.
# Needs one or more GPUs, verl 0.9.1 with vLLM (pip install 'klguard[verl]' 'verl[vllm]==0.9.1') and nothing from
# the network: the model, tokenizer and data are built here. Writes $OUT/verl_plugin.json (default: /tmp).
#   bash benchmarks/gpu/verl_plugin.sh
set -euo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-/tmp}
WORK=$(mktemp -d)
python benchmarks/gpu/tiny_assets.py "$WORK"  # the tiny Qwen2, GSM8K-format parquet, a custom reward
python -c "import vllm" 2>/dev/null || { echo "verl_plugin.sh: vLLM is not installed: the check needs verl[vllm]"; exit 2; }
export VERL_FILE_LOGGER_PATH="$WORK/verl_log.jsonl"
start=$(date +%s)
timeout 600 python -m verl.trainer.main_ppo \
  algorithm.adv_estimator=grpo algorithm.use_kl_in_reward=True algorithm.kl_ctrl.kl_coef=0.001 \
  data.train_files="$WORK/train.parquet" data.val_files="$WORK/test.parquet" \
  data.train_batch_size=8 data.max_prompt_length=128 data.max_response_length=16 \
  actor_rollout_ref.model.path="$WORK/qwen2-tiny" actor_rollout_ref.actor.optim.lr=1e-4 \
  actor_rollout_ref.actor.ppo_mini_batch_size=4 actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=4 \
  actor_rollout_ref.rollout.name=vllm actor_rollout_ref.rollout.n=4 actor_rollout_ref.rollout.tensor_model_parallel_size=1 \
  actor_rollout_ref.rollout.gpu_memory_utilization=0.3 actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=8 \
  actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=8 \
  trainer.v1.trainer_mode=klguard +klguard.guard.kl_hard_limit=1e-9 +klguard.guard.max_rollbacks=1 \
  trainer.logger='["console","file"]' trainer.n_gpus_per_node=1 trainer.nnodes=1 trainer.save_freq=1 \
  trainer.test_freq=-1 trainer.val_before_train=False trainer.total_training_steps=6 \
  trainer.default_local_dir="$WORK/ckpt" 2>&1 | tail -40 || true
seconds=$(( $(date +%s) - start ))
set +e
klguard watch "$VERL_FILE_LOGGER_PATH" guard.kl_hard_limit=1e-9 > "$WORK/watch.txt" 2>&1; watch_rc=$?
set -e
python - "$WORK" "$OUT" "$seconds" "$watch_rc" <<'PY'
import json, sys
from pathlib import Path
work, out, seconds, watch_rc = Path(sys.argv[1]), Path(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
events_file = work / "ckpt" / "events.jsonl"
events = [json.loads(x) for x in events_file.read_text().splitlines()] if events_file.is_file() else []
log = work / "verl_log.jsonl"
steps = [json.loads(x)["step"] for x in log.read_text().splitlines()] if log.is_file() else []
result = {"seconds": seconds, "steps_logged": steps, "decisions": [(e["step"], e["kind"]) for e in events],
          "rolled_back": any(e["kind"] == "rollback" for e in events), "paused": any(e["kind"] == "pause" for e in events),
          "guard_metrics_logged": bool(log.is_file() and "guard/rollbacks" in log.read_text()),
          "watch_exit": watch_rc, "watch_output": (work / "watch.txt").read_text().splitlines()[-3:]}
(out / "verl_plugin.json").write_text(json.dumps(result, indent=1))
print(json.dumps(result, indent=1))
PY
