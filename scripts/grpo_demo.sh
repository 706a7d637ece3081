#!/usr/bin/env bash
# SFT -> GRPO on the built-in task, CPU-sized, then held-out evaluation of both checkpoints
# (200 problems: greedy accuracy, maj@8, pass@8 at temperature 0.7). Prints the comparison table.
#   bash scripts/grpo_demo.sh [run-name] [extra overrides for every stage...]
set -euo pipefail
RUN=${1:-grpo_demo}
shift || true
# micro-batch 32: the SFT checkpoint of the README's measured run (the same maths as the preset's 16,
# but another floating-point path, and SFT end points on this task vary a lot; see README)
rlft train algo=sft run.name="$RUN" train.micro_batch_per_device=32 "$@"
rlft train algo=grpo run.name="$RUN" "$@"
for stage in sft grpo; do
  rlft eval model.path=stage:$stage run.name="$RUN" "$@"
done
python3 "$(dirname "$0")/eval_table.py" "runs/$RUN" sft grpo
