#!/usr/bin/env bash
# Step time of the SFT stage under ZeRO-0/2/3 at 1 and 2 ranks (same global batch), from each
# run's metrics.jsonl. Prints a markdown table. CPU by default; pass overrides to change, e.g.
#   bash scripts/bench_engine.sh deepspeed.device=cuda deepspeed.precision=bf16
set -euo pipefail
OUT=${BENCH_DIR:-runs/bench_engine}
STEPS=${STEPS:-30}
COMMON=(algo=sft run.root="$OUT" train.max_steps="$STEPS" train.log_every=10 train.save_every=0
        train.batch_size=32 train.micro_batch_per_device=16 logger.wandb=disabled logger.progress=false "$@")
echo "| ZeRO | ranks | step time (s), mean of steps 11-$STEPS | final loss |"
echo "|---|---|---|---|"
for stage in 0 2 3; do
  for ranks in 1 2; do
    name=z${stage}r${ranks}
    rlft train "${COMMON[@]}" run.name=$name deepspeed.zero_stage=$stage deepspeed.nproc_per_node=$ranks >/dev/null 2>&1 \
      || { echo "| $stage | $ranks | failed | |"; continue; }
    python3 - "$OUT/$name/sft/metrics.jsonl" "$stage" "$ranks" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
timed = [r for r in rows if "step_time_s" in r and r["step"] > 10]
loss = [r["loss"] for r in rows if "loss" in r][-1]
mean = sum(r["step_time_s"] for r in timed) / len(timed)
print(f"| {sys.argv[2]} | {sys.argv[3]} | {mean:.3f} | {loss:.4f} |")
PY
  done
done
