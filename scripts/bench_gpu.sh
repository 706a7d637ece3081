#!/usr/bin/env bash
# The GPU benchmark in one command. On a machine with torch and transformers but no package index,
# wheels of the other dependencies placed in .whl/ are installed first. Then it runs the default GPU
# workload (Qwen2-0.5B shape, bf16, 8 prompts x 8 samples, 128 + 256 tokens) for rlft against TRL's
# GRPOTrainer. First the lean sampler's and the shared-prefix forward's tests on the GPU (CUDA-graph
# decoding against eager and Hugging Face), then rlft with the lean sampler (its decoding step a
# CUDA graph), rlft's GPU default (Hugging Face's compiled static cache) against TRL's default and
# against TRL's best non-vLLM setting (static cache, bf16), then rlft with the plain update forward,
# with the dynamic cache, and with a reference model.
# Results (JSON + the printed tables) go to ${OUT:-bench_out}/.
set -uo pipefail
OUT=${OUT:-bench_out}
mkdir -p "$OUT"
if [ -d .whl ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    && export PYTHONPATH=/tmp/site:$PWD
fi
export PYTHONPATH=${PYTHONPATH:-$PWD} WANDB_MODE=disabled
# each step below is cut after LIMIT seconds, so one slow or hung run cannot take the whole budget
LIMIT=${LIMIT:-240}
nvidia-smi --query-gpu=name,memory.total --format=csv > "$OUT/gpu.txt" 2>&1
# correctness of the lean sampler (CUDA graph vs eager vs Hugging Face) and the shared-prefix forward on this GPU
# (not the CPU decoding kernel's tests: building it would spend GPU time on a C++ compile)
if python3 -c "import pytest" 2>/dev/null; then
  timeout "$LIMIT" python3 -m pytest -q -p no:cacheprovider tests/unit/test_lean.py tests/unit/test_prefix.py \
    -k "not native and not described" 2>&1 | tail -15 | tee "$OUT/tests.txt"
fi
timeout "$LIMIT" python3 scripts/bench.py --generation-impl lean --out "$OUT/bench_rlft_lean.json" 2>&1 | tee "$OUT/bench_rlft_lean.txt"
timeout "$LIMIT" python3 scripts/bench.py --peer trl --peer-cache default --out "$OUT/bench_trl_default.json" 2>&1 | tee "$OUT/bench_trl_default.txt"
timeout "$LIMIT" python3 scripts/bench.py --peer trl --peer-cache static --peer-dtype bfloat16 --out "$OUT/bench_trl_static.json" 2>&1 | tee "$OUT/bench_trl_static.txt"
timeout "$LIMIT" python3 scripts/bench.py --generation-impl lean --shared-prefix false --out "$OUT/bench_rlft_plain_update.json" 2>&1 | tee "$OUT/bench_rlft_plain_update.txt"
timeout "$LIMIT" python3 scripts/bench.py --cache dynamic --generation-impl hf --out "$OUT/bench_rlft_dynamic.json" 2>&1 | tee "$OUT/bench_rlft_dynamic.txt"
timeout "$LIMIT" python3 scripts/bench.py --generation-impl lean --kl-coef 0.04 --out "$OUT/bench_rlft_kl.json" 2>&1 | tee "$OUT/bench_rlft_kl.txt"
# one table of every run above, with the goals checked
python3 scripts/bench_summary.py "$OUT" --out "$OUT/summary.md"
