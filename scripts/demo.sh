#!/usr/bin/env bash
# The main job on the built-in default (tiny model, synthetic arithmetic task), CPU-friendly: SFT, then GRPO
# from the SFT model with the rule reward on 12,800 sampled completions, then both evaluated on the same 200
# held-out problems (one comparison table) and every stage's training curves drawn.
#   bash scripts/demo.sh [run-name] [overrides for every stage]      (make demo runs this)
set -euo pipefail
RUN=${1:-demo}
shift || true
rlft train algo=sft  run.name="$RUN" "$@"
rlft train algo=grpo run.name="$RUN" train.max_samples=12800 "$@"
rlft eval run.name="$RUN" "eval.models=[stage:sft,stage:grpo]" "$@"
rlft plot "runs/$RUN"
echo "outputs: runs/$RUN/{sft,grpo}/final, runs/$RUN/eval/comparison.md, runs/$RUN/plots/"
