#!/usr/bin/env bash
# Every RL algorithm at an equal sample budget, several seeds: see scripts/rl_table.py (--help).
#   bash scripts/rl_table.sh [--budget 25600] [--seeds 0,1,2] [--jobs 2] [-- overrides for every command]
set -euo pipefail
exec python3 "$(dirname "$0")/rl_table.py" "$@"
