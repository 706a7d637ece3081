#!/usr/bin/env bash
# GRPO through the hf and the vllm rollout engines from one SFT model, several seeds each: held-out
# greedy accuracy after GRPO, step and rollout time, and the engine/trainer log-prob gap. Prints a
# markdown table (docs/performance.md, "Rollout engines").
#   bash scripts/engine_parity.sh [run-name] [extra overrides for the GRPO runs...]
#   STEPS=200 SEEDS="0 1 2" bash scripts/engine_parity.sh
set -euo pipefail
RUN=${1:-engine_parity}
shift || true
STEPS=${STEPS:-200}
SEEDS=${SEEDS:-0 1 2}
export WANDB_MODE=${WANDB_MODE:-disabled}
[ -f "runs/$RUN/sft/final/config.json" ] || rlft train algo=sft run.name="$RUN" logger.progress=false
for seed in $SEEDS; do
  for engine in hf vllm; do
    dir="runs/$RUN/grpo_${engine}_s$seed"
    [ -f "$dir/manifest.json" ] && continue
    rlft train algo=grpo run.name="$RUN" run.dir="$dir" seed="$seed" rollout.engine="$engine" \
      train.max_steps="$STEPS" train.save_every=0 algo.eval_every="$STEPS" logger.progress=false "$@"
  done
done
python3 - "runs/$RUN" "$SEEDS" <<'PY'
import json, statistics, sys
from pathlib import Path
root, seeds = Path(sys.argv[1]), sys.argv[2].split()
def rows(p): return [json.loads(l) for l in open(p) if l.strip()]
print("| engine | held-out greedy accuracy (per seed) | mean ± std | step s | rollout s | max abs log-prob gap |")
print("|---|---|---|---|---|---|")
for engine in ("hf", "vllm"):
    accs, steps, rolls, gaps = [], [], [], []
    for s in seeds:
        recs = rows(root / f"grpo_{engine}_s{s}" / "metrics.jsonl")
        accs.append([r["eval_greedy_accuracy"] for r in recs if "eval_greedy_accuracy" in r][-1])
        timed = [r for r in recs if "time/step_s" in r][1:]  # the first window includes start-up
        steps += [r["time/step_s"] for r in timed]
        rolls += [r["time/sample_s"] + r["time/score_s"] for r in timed]
        gaps += [r["engine_logp_gap_max"] for r in recs if "engine_logp_gap_max" in r]
    gap = f"{max(gaps):.1e}" if gaps else "n/a (no correction)"
    print(f"| {engine} | {', '.join(f'{a:.3f}' for a in accs)} | {statistics.mean(accs):.3f} ± "
          f"{statistics.stdev(accs) if len(accs) > 1 else 0:.3f} | {statistics.median(steps):.2f} | "
          f"{statistics.median(rolls):.2f} | {gap} |")
start = [r["eval_greedy_accuracy"] for e in ("hf", "vllm") for s in seeds
         for r in rows(root / f"grpo_{e}_s{s}" / "metrics.jsonl") if r["step"] == 0 and "eval_greedy_accuracy" in r]
print(f"\nSFT (step 0 of each run): held-out greedy accuracy {', '.join(f'{a:.3f}' for a in sorted(set(start)))}")
PY
