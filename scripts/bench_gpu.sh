#!/usr/bin/env bash
# The GPU benchmark in one command. On a machine with torch and transformers but no package index,
# wheels of the other dependencies placed in .whl/ are installed first. Then it runs the default GPU
# workload (Qwen2-0.5B shape, bf16, 8 prompts x 8 samples, 128 + 256 tokens) for rlft against TRL's
# GRPOTrainer with its default cache and with its best non-vLLM setting (static cache), then rlft
# alone with the lean sampler (the GPU default is Hugging Face's compiled static cache), with the
# plain update forward (no shared prefix), with the dynamic cache, and with a reference model.
# Results (JSON + the printed tables) go to ${OUT:-bench_out}/.
set -uo pipefail
OUT=${OUT:-bench_out}
mkdir -p "$OUT"
if [ -d .whl ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    && export PYTHONPATH=/tmp/site:$PWD
fi
export PYTHONPATH=${PYTHONPATH:-$PWD} WANDB_MODE=disabled
nvidia-smi --query-gpu=name,memory.total --format=csv > "$OUT/gpu.txt" 2>&1
python3 scripts/bench.py --peer trl --peer-cache default --out "$OUT/bench_trl_default.json" 2>&1 | tee "$OUT/bench_trl_default.txt"
python3 scripts/bench.py --peer trl --peer-cache static --peer-dtype bfloat16 --out "$OUT/bench_trl_static.json" 2>&1 | tee "$OUT/bench_trl_static.txt"
python3 scripts/bench.py --generation-impl lean --out "$OUT/bench_rlft_lean.json" 2>&1 | tee "$OUT/bench_rlft_lean.txt"
python3 scripts/bench.py --shared-prefix false --out "$OUT/bench_rlft_plain_update.json" 2>&1 | tee "$OUT/bench_rlft_plain_update.txt"
python3 scripts/bench.py --cache dynamic --generation-impl hf --out "$OUT/bench_rlft_dynamic.json" 2>&1 | tee "$OUT/bench_rlft_dynamic.txt"
python3 scripts/bench.py --kl-coef 0.04 --out "$OUT/bench_rlft_kl.json" 2>&1 | tee "$OUT/bench_rlft_kl.txt"
