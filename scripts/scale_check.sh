#!/usr/bin/env bash
# A model of Qwen2.5-0.5B's size on CPU: SFT and GRPO, ZeRO-3 on 2 ranks and LoRA on 1 rank, measured
# peak memory per rank against rlft.memory's arithmetic. See scripts/scale_check.py (--help).
#   bash scripts/scale_check.sh [--out runs/scale] [--setups zero3,lora]
set -euo pipefail
export WANDB_MODE="${WANDB_MODE:-disabled}"
exec python3 "$(dirname "$0")/scale_check.py" "$@"
