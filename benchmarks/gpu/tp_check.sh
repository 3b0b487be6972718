#!/usr/bin/env bash
# GPU check of FSDP3D (issue 21), a few minutes. Nothing from the network: the tiny Qwen2 (tied embeddings, 4 heads,
# 2 kv heads), its BPE tokenizer and GSM8K-format parquet are built here by the CPU tests' helpers.
# - 2 or more GPUs: the same 5-step PPO run (GAE critic) on one GPU and as tensor_parallel_size=2 over 2 GPUs
#   (nccl, strategy fsdp_turbo, trainer.debug=true: every rank's numbers asserted equal, rank_checks.jsonl), then
#   the per-step differences of the logged metrics (bf16 autocast rounds differently on each layout: reported,
#   not asserted) and each rank's parameter count.
# - 1 GPU: the FSDP2 + bf16 + CPU-offload path (actor_rollout_ref.actor.fsdp_config.offload_policy=true turns on
#   FSDP2 on a one-rank mesh) for 5 steps, then a resume from its DCP checkpoint.
# Writes $OUT/tp_check.json (default /tmp) and prints it.   bash benchmarks/gpu/tp_check.sh
# Rehearsed on this project's CPU with DEVICE=cpu NGPU=2 and NGPU=1 (gloo); it has not yet run on a GPU.
set -euo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-/tmp}
WORK=$(mktemp -d)
python benchmarks/gpu/tiny_assets.py "$WORK"  # the tiny Qwen2, GSM8K-format parquet, a custom reward
NGPU=${NGPU:-$(python -c "import torch; print(torch.cuda.device_count())")}
DEVICE=${DEVICE:-cuda}  # DEVICE=cpu NGPU=2 (or 1) rehearses the script on a CPU, gloo instead of nccl
ARGS=(data.train_files="$WORK/train.parquet" data.val_files="$WORK/test.parquet" data.train_batch_size=8
      data.max_prompt_length=128 data.max_response_length=16 actor_rollout_ref.model.path="$WORK/qwen2-tiny"
      actor_rollout_ref.actor.ppo_mini_batch_size=4 actor_rollout_ref.actor.optim.lr=1e-4
      actor_rollout_ref.actor.fsdp_config.dtype=bfloat16 critic.model.fsdp_config.dtype=bfloat16
      trainer.device=$DEVICE trainer.total_training_steps=5 trainer.save_freq=5 trainer.test_freq=5
      trainer.logger=[jsonl] trainer.progress_bar=false trainer.debug=true custom_reward_function.path="$WORK/reward.py")
TP=(actor_rollout_ref.actor.strategy=fsdp_turbo critic.strategy=fsdp_turbo
    actor_rollout_ref.actor.fsdp_config.turbo_config.distributed.tensor_parallel_size=2)
status=0
if [ "$NGPU" -ge 2 ]; then
  MODE=tp2
  timeout 400 python -m klguard train "${ARGS[@]}" trainer.default_local_dir="$WORK/one" > "$WORK/one.log" 2>&1 || status=$?
  timeout 400 python -m torch.distributed.run --standalone --nproc_per_node=2 -m klguard train "${ARGS[@]}" "${TP[@]}" \
    trainer.default_local_dir="$WORK/tp2" > "$WORK/tp2.log" 2>&1 || status=$?
elif [ "$NGPU" -eq 1 ]; then
  MODE=offload
  timeout 400 python -m klguard train "${ARGS[@]}" actor_rollout_ref.actor.fsdp_config.offload_policy=true \
    trainer.default_local_dir="$WORK/offload" > "$WORK/offload.log" 2>&1 || status=$?
  timeout 200 python -m klguard train "${ARGS[@]}" actor_rollout_ref.actor.fsdp_config.offload_policy=true \
    trainer.total_training_steps=6 trainer.default_local_dir="$WORK/offload" > "$WORK/resume.log" 2>&1 || status=$?
else
  echo "tp_check.sh: no CUDA device"; exit 2
fi
python - "$WORK" "$MODE" "$status" "$OUT/tp_check.json" <<'PY'
import json, sys
from pathlib import Path
work, mode, status, out = Path(sys.argv[1]), sys.argv[2], int(sys.argv[3]), Path(sys.argv[4])
def rows(name):
    path = work / name / "metrics.jsonl"
    return {r["step"]: r for r in map(json.loads, path.read_text().splitlines())} if path.is_file() else {}
def tail(name):
    path = work / f"{name}.log"
    return path.read_text()[-3000:] if path.is_file() else ""
result = {"mode": mode, "exit_status": status}
if mode == "tp2":
    one, tp2 = rows("one"), rows("tp2")
    keys = ["critic/score/mean", "actor/pg_loss", "actor/entropy", "actor/reward_kl_penalty", "critic/vf_loss",
            "actor/grad_norm"]
    result["max_abs_diff_per_step"] = {s: {k: abs(one[s][k] - tp2[s][k]) for k in keys if k in one[s] and k in tp2[s]}
                                       for s in sorted(one.keys() & tp2.keys()) if s}
    checks = work / "tp2" / "rank_checks.jsonl"
    result["rank_checks_last"] = json.loads(checks.read_text().splitlines()[-1]) if checks.is_file() else None
    result["step_s"] = {n: [r.get("timing_s/step") for s, r in sorted(d.items()) if s] for n, d in (("one", one), ("tp2", tp2))}
    result["log_tails"] = {"one": tail("one")[-800:], "tp2": tail("tp2")[-1500:]}
else:
    off = rows("offload")
    result["steps_logged"] = sorted(off)
    result["step_s"] = [r.get("timing_s/step") for s, r in sorted(off.items()) if s]
    result["checkpoint_files"] = sorted(p.name for p in (work / "offload" / "global_step_5" / "actor").glob("*"))
    result["resumed"] = "resumed from" in tail("resume")
    result["log_tails"] = {"offload": tail("offload")[-1500:], "resume": tail("resume")[-800:]}
out.write_text(json.dumps(result, indent=1))
print(json.dumps(result, indent=1))
PY
exit $status
