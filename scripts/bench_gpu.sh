#!/usr/bin/env bash
# The GPU check and benchmark in one command. On a machine with torch and transformers but no package
# index, wheels of the other dependencies placed in .whl/ are installed first. In order of importance,
# each step cut at its share of the time left (BUDGET seconds in all, default 480):
#   1. the rollout engines' tests and the asynchronous sampler's tests on the GPU;
#   2. the tiny pipeline through the CLI on the GPU: SFT, GRPO, GRPO with rollout.max_staleness=1
#      (a sampler process on the same GPU), PPO, distillation from the GRPO model in bf16 (its log names the
#      teacher's dtype and device; metrics.jsonl has time/teacher_s), eval; each must finish and write its checkpoint;
#   3. the default GPU workload (Qwen2-0.5B shape, bf16, 8 prompts x 8 samples, 128 + 256 tokens):
#      rlft (hf engine, transformers' compiled static cache) beside TRL's GRPOTrainer at its default,
#      rlft asynchronous (one rollout ahead), rlft with vllm where vllm imports, rlft with the dynamic
#      cache, TRL at its best setting without vLLM (static cache, bf16), rlft with a reference model;
#   4. memory: the default workload's whole batch in one micro-batch with activation checkpointing, through
#      rlft's chunked head, liger-kernel's fused loss (train.fused_loss=liger) and the model's own logits
#      (train.logit_chunk_tokens=0); SFT through liger's Triton cross-entropy on the GPU.
# liger-kernel is a pure-Python wheel the GPU machine lacks: `pip download --no-deps liger-kernel==0.8.5 -d .whl`.
# ONLY=<regex> runs only the steps whose names match (e.g. ONLY='cli_|async').
# Results (JSON, logs, the printed tables) go to ${OUT:-bench_out}/, each as soon as it is measured;
# scripts/bench_summary.py makes one table of them with the goals checked.
set -uo pipefail
OUT=${OUT:-bench_out}
mkdir -p "$OUT"
START=$(date +%s)
BUDGET=${BUDGET:-480}
ONLY=${ONLY:-.}
if [ -d .whl ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    && export PYTHONPATH=/tmp/site:$PWD && export PATH=/tmp/site/bin:$PATH
fi
export PYTHONPATH=${PYTHONPATH:-$PWD} WANDB_MODE=disabled PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,memory.total --format=csv > "$OUT/gpu.txt" 2>&1
python3 -c "import torch, transformers; print('torch', torch.__version__, 'transformers', transformers.__version__)" >> "$OUT/gpu.txt" 2>&1

# run NAME MAX_S CMD...: the command's output to $OUT/NAME.txt, cut at MAX_S or at the time left
run() {
  local name=$1 max=$2; shift 2
  [[ $name =~ $ONLY ]] || return 0
  local left=$(( BUDGET - ($(date +%s) - START) ))
  if (( left < 20 )); then echo "$name: skipped, ${left}s left" | tee -a "$OUT/steps.txt"; return; fi
  local limit=$(( max < left ? max : left )) t0=$(date +%s)
  timeout "$limit" "$@" > "$OUT/$name.txt" 2>&1
  local rc=$?
  echo "$name: rc=$rc in $(( $(date +%s) - t0 ))s (limit ${limit}s)" | tee -a "$OUT/steps.txt"
  tail -4 "$OUT/$name.txt"
}

run tests 90 python3 -m pytest -q -p no:cacheprovider tests/unit/test_generate.py tests/unit/test_async_sampler.py \
  tests/integration/test_vllm.py tests/unit/test_liger.py -k "not two_ranks"
RUNS=$(mktemp -d)
run cli_sft 60 python3 -m rlft.cli train algo=sft run.name=gpu run.root="$RUNS" train.max_steps=30
run cli_grpo 90 python3 -m rlft.cli train algo=grpo run.name=gpu run.root="$RUNS" train.max_steps=3
run cli_grpo_async 90 python3 -m rlft.cli train algo=grpo run.name=gpu_async run.root="$RUNS" \
  model.path="$RUNS/gpu/sft/final" train.max_steps=3 rollout.max_staleness=1
run cli_ppo 90 python3 -m rlft.cli train algo=ppo run.name=gpu run.root="$RUNS" train.max_steps=4 critic.init=stage:sft
run cli_distill 90 python3 -m rlft.cli train algo=distill run.name=gpu run.root="$RUNS" train.max_steps=3 \
  teacher.path="$RUNS/gpu/grpo/final" deepspeed.precision=bf16
run cli_eval 60 python3 -m rlft.cli eval run.name=gpu run.root="$RUNS" eval.num_problems=50
ls "$RUNS"/gpu/*/final "$RUNS"/gpu_async/*/final >> "$OUT/steps.txt" 2>&1
run bench_trl_default 200 python3 scripts/bench.py --engine hf --peer trl --peer-cache default --out "$OUT/bench_trl_default.json"
run bench_rlft_hf_async 150 python3 scripts/bench.py --engine hf --max-staleness 1 --out "$OUT/bench_rlft_hf_async.json"
if python3 -c "import vllm" 2>/dev/null; then
  run bench_rlft_vllm 150 python3 scripts/bench.py --engine vllm --out "$OUT/bench_rlft_vllm.json"
  run bench_rlft_vllm_async 150 python3 scripts/bench.py --engine vllm --max-staleness 1 --out "$OUT/bench_rlft_vllm_async.json"
else
  echo "vllm is not importable here: the vllm rows are skipped" | tee -a "$OUT/steps.txt"
fi
run bench_rlft_ckpt 150 python3 scripts/bench.py --engine hf --activation-checkpointing --out "$OUT/bench_rlft_ckpt.json"
if python3 -c "import liger_kernel.chunked_loss" 2>/dev/null; then
  run bench_rlft_ckpt_liger 150 python3 scripts/bench.py --engine hf --activation-checkpointing --fused-loss liger \
    --out "$OUT/bench_rlft_ckpt_liger.json"
  run cli_sft_liger 60 python3 -m rlft.cli train algo=sft run.name=gpu_liger run.root="$RUNS" train.max_steps=30 \
    train.fused_loss=liger
else
  echo "liger_kernel is not importable here: the liger rows are skipped" | tee -a "$OUT/steps.txt"
fi
run bench_rlft_ckpt_logits 150 python3 scripts/bench.py --engine hf --activation-checkpointing --logit-chunk-tokens 0 \
  --out "$OUT/bench_rlft_ckpt_logits.json"
run bench_rlft_dynamic 150 python3 scripts/bench.py --engine hf --cache dynamic --out "$OUT/bench_rlft_dynamic.json"
run bench_trl_static 200 python3 scripts/bench.py --engine hf --peer trl --peer-cache static --peer-dtype bfloat16 --out "$OUT/bench_trl_static.json"
run bench_rlft_kl 120 python3 scripts/bench.py --kl-coef 0.04 --out "$OUT/bench_rlft_kl.json"
# one table of every run above, with the goals checked
python3 scripts/bench_summary.py "$OUT" --out "$OUT/summary.md" 2>&1 | tee "$OUT/summary.txt"
