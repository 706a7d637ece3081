#!/usr/bin/env bash
# The main job on the built-in default (tiny model, synthetic arithmetic task), CPU-friendly:
# SFT, then the outcome reward model and the process reward model, then evaluation of the SFT model.
#   bash scripts/demo.sh [run-name]          (make demo runs this)
set -euo pipefail
RUN=${1:-demo}
shift || true
rlft train algo=sft run.name="$RUN" "$@"
rlft train algo=rm  run.name="$RUN" "$@"
rlft train algo=prm run.name="$RUN" "$@"
rlft eval run.name="$RUN"
echo "outputs: runs/$RUN/{sft,rm,prm}/final and runs/$RUN/eval/sft/eval.json"
