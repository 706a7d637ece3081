#!/usr/bin/env bash
# Every RL algorithm of the built-in task from one SFT model (and one RM), evaluated on the same
# 200 held-out problems: accuracy, pass@k, maj@k, reward and RM score of the policy's own samples,
# and their KL to the SFT model. Ends with the comparison table (the README's table comes from it).
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

train sft algo=sft
train rm algo=rm
train prm algo=prm
# each algorithm with its preset; the GRPO variants with VARIANT_STEPS (default 100) to fit a CPU budget
VARIANT_STEPS=${VARIANT_STEPS:-100}
train grpo algo=grpo
train grpo_process algo=grpo algo.advantage=grpo_process train.max_steps="$VARIANT_STEPS"
train grpo_iterative algo=grpo algo.advantage=grpo_process iterative.iterations=2 train.max_steps="$VARIANT_STEPS"
train online_rft algo=online_rft train.max_steps="$VARIANT_STEPS"
train rft algo=rft train.max_steps="$VARIANT_STEPS"
train ppo algo=ppo
train p3o_joint algo=p3o algo.pairwise_loss=p3o_joint
train p3o_separate algo=p3o algo.pairwise_loss=p3o_separate
train dpo algo=dpo
train online_dpo algo=online_dpo
MODELS=(sft grpo grpo_process grpo_iterative online_rft rft ppo p3o_joint p3o_separate dpo online_dpo)
for m in "${MODELS[@]}"; do
  if [ -f "$ROOT/eval/$m/eval.json" ]; then echo "[skip] eval of $m is complete"; continue; fi
  rlft eval "${COMMON[@]}" model.path="$ROOT/$m/final"
done
python3 -m rlft.eval.compare "$ROOT" "${MODELS[@]}"
