#!/usr/bin/env bash
# The GPU benchmark in one command. On a machine with torch and transformers but no package index,
# wheels of the other dependencies placed in .whl/ are installed first. Then it runs the default GPU
# workload (Qwen2-0.5B shape, bf16, 8 prompts x 8 samples, 128 + 256 tokens): first the rollout
# engines' tests, then rlft with the vllm engine (where vllm imports) and with the hf engine
# (transformers' compiled static cache), each also asynchronous (a sampler process on the same GPU, one
# rollout ahead: rollout.max_staleness=1), TRL's GRPOTrainer at its default and at its best setting
# without vLLM (static cache, bf16), rlft with the dynamic cache, and rlft with a reference model.
# Results (JSON + the printed tables) go to ${OUT:-bench_out}/, each as soon as it is measured.
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
if python3 -c "import pytest" 2>/dev/null; then
  timeout "$LIMIT" python3 -m pytest -q -p no:cacheprovider tests/unit/test_generate.py tests/integration/test_vllm.py \
    -k "not two_ranks" 2>&1 | tail -15 | tee "$OUT/tests.txt"
fi
if python3 -c "import vllm" 2>/dev/null; then
  timeout "$LIMIT" python3 scripts/bench.py --engine vllm --out "$OUT/bench_rlft_vllm.json" 2>&1 | tee "$OUT/bench_rlft_vllm.txt"
  # asynchronous: a vLLM sampler process on the same GPU (rollout.vllm.gpu_memory_utilization of it), one rollout ahead
  timeout "$LIMIT" python3 scripts/bench.py --engine vllm --max-staleness 1 --out "$OUT/bench_rlft_vllm_async.json" 2>&1 | tee "$OUT/bench_rlft_vllm_async.txt"
else
  echo "vllm is not importable here: the vllm rows are skipped" | tee "$OUT/vllm.txt"
fi
timeout "$LIMIT" python3 scripts/bench.py --engine hf --peer trl --peer-cache default --out "$OUT/bench_trl_default.json" 2>&1 | tee "$OUT/bench_trl_default.txt"
timeout "$LIMIT" python3 scripts/bench.py --engine hf --peer trl --peer-cache static --peer-dtype bfloat16 --out "$OUT/bench_trl_static.json" 2>&1 | tee "$OUT/bench_trl_static.txt"
timeout "$LIMIT" python3 scripts/bench.py --engine hf --max-staleness 1 --out "$OUT/bench_rlft_hf_async.json" 2>&1 | tee "$OUT/bench_rlft_hf_async.txt"
timeout "$LIMIT" python3 scripts/bench.py --engine hf --cache dynamic --out "$OUT/bench_rlft_dynamic.json" 2>&1 | tee "$OUT/bench_rlft_dynamic.txt"
timeout "$LIMIT" python3 scripts/bench.py --kl-coef 0.04 --out "$OUT/bench_rlft_kl.json" 2>&1 | tee "$OUT/bench_rlft_kl.txt"
# one table of every run above, with the goals checked
python3 scripts/bench_summary.py "$OUT" --out "$OUT/summary.md"
