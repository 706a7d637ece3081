#!/usr/bin/env bash
# Every RL variant of the built-in task from one SFT model, evaluated on the same 200 held-out
# problems; ends with the comparison table (the README's table comes from this script).
#   bash scripts/rl_table.sh [run-name] [extra overrides for every stage...]
# Stages already complete in the run (manifest.json present) are not trained again.
set -euo pipefail
RUN=${1:-rl_table}
shift || true
COMMON=(run.name="$RUN" "$@")
ROOT=runs/$RUN

train() {  # train <output dir name> <overrides...>
  local dir=$1; shift
  if [ -f "$ROOT/$dir/manifest.json" ]; then echo "[skip] $dir is complete"; return; fi
  rlft train "${COMMON[@]}" run.dir="$ROOT/$dir" "$@"
}
evaluate() {
  rlft eval "${COMMON[@]}" model.path="$ROOT/$1/final"
}

train sft algo=sft
train rm algo=rm
train prm algo=prm
# GRPO with the preset's 300 steps; the variants with VARIANT_STEPS (default 100) to fit a CPU budget
VARIANT_STEPS=${VARIANT_STEPS:-100}
train grpo algo=grpo
train grpo_process algo=grpo algo.advantage=grpo_process train.max_steps="$VARIANT_STEPS"
train grpo_iterative algo=grpo algo.advantage=grpo_process algo.iterations=2 train.max_steps="$VARIANT_STEPS"
train online_rft algo=online_rft train.max_steps="$VARIANT_STEPS"
train rft algo=rft train.max_steps="$VARIANT_STEPS"
for stage in sft grpo grpo_process grpo_iterative online_rft rft; do evaluate $stage; done
python3 "$(dirname "$0")/eval_table.py" "$ROOT" sft grpo grpo_process grpo_iterative online_rft rft
