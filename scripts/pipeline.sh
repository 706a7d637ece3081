#!/usr/bin/env bash
# The whole pipeline under one run name: SFT -> RM (and the PRM when the RL stage needs it) -> RL ->
# evaluation of the SFT and RL models -> comparison table (runs/<run>/eval/comparison.md).
#
#   bash scripts/pipeline.sh <rl-algo> [run-name] [overrides for every stage...]
#   bash scripts/pipeline.sh grpo demo
#   RL_ARGS="train.max_steps=100" bash scripts/pipeline.sh grpo_process demo   # process supervision
#
# Rerunning is safe and cheap: a complete stage (manifest.json present) is skipped, a stage that was
# interrupted after a checkpoint resumes from its newest one (resume=true), anything else starts
# fresh. Per-stage overrides: SFT_ARGS, RM_ARGS, PRM_ARGS, RL_ARGS, EVAL_ARGS (space-separated).
set -euo pipefail
ALGO=${1:?usage: pipeline.sh <rl-algo: grpo|ppo|p3o|dpo|online_dpo|rft|online_rft> [run-name] [overrides...]}
RUN=${2:-pipeline}
shift; shift || true
case "$ALGO" in
  grpo|grpo_process|ppo|p3o|dpo|online_dpo|rft|online_rft) ;;
  *) echo "pipeline.sh: unknown RL algorithm '$ALGO'; valid: grpo, grpo_process, ppo, p3o, dpo, online_dpo, rft, online_rft" >&2
     exit 2 ;;
esac
ROOT=${RUN_ROOT:-runs}/$RUN
COMMON=(run.name="$RUN" "$@")
[ -n "${RUN_ROOT:-}" ] && COMMON+=(run.root="$RUN_ROOT")

stage() {  # stage <algo> <extra overrides (one string)>
  local algo=$1 extra=$2 dir=$ROOT/$1
  if [ -f "$dir/manifest.json" ]; then
    echo "[pipeline] $algo: complete, skipped"
    return
  fi
  local resume=()
  if compgen -G "$dir/checkpoints/step-*" > /dev/null; then
    echo "[pipeline] $algo: interrupted, resuming from its newest checkpoint"
    resume=(resume=true)
  else
    echo "[pipeline] $algo: training"
  fi
  # shellcheck disable=SC2086  # the *_ARGS strings are lists of overrides
  rlft train algo="$algo" "${COMMON[@]}" "${resume[@]}" $extra
}

needs_prm=false
case " $ALGO ${RL_ARGS:-} $* " in *grpo_process*|*prm*) needs_prm=true ;; esac

stage sft "${SFT_ARGS:-}"
stage rm "${RM_ARGS:-}"
if $needs_prm; then stage prm "${PRM_ARGS:-}"; fi
stage "$ALGO" "${RL_ARGS:-}"
# shellcheck disable=SC2086
rlft eval "${COMMON[@]}" "eval.models=[stage:sft,stage:$ALGO]" ${EVAL_ARGS:-}
echo "[pipeline] done: $ROOT/{sft,rm,$ALGO}/final; table: $ROOT/eval/comparison.md"
