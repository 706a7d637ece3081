#!/usr/bin/env python3
"""Samples per hour of SmolLM2's GRPO on this machine, one configuration at a time: the smollm2_grpo recipe from
one SFT model, a few steps each, the phase times read from metrics.jsonl (the first step left out).

    python scripts/smollm2_speed.py --sft runs/smol/sft/final                  # every configuration
    python scripts/smollm2_speed.py --sft runs/smol/sft/final --configs recipe,plain --steps 6

Configurations (the recipe shares each group's prompt in the forwards and the prefill; the others change it):
  recipe        experiment=smollm2_grpo as shipped (train.share_prompt, rollout.hf_share_prefill)
  plain         neither: every completion's forward and prefill runs its whole prompt
  shared        train.share_prompt only
  micro8        the recipe with train.micro_batch_per_device=8 (the recipe's micro-batch before it was 64)
  lora          the recipe + model.lora.rank=16 (the reference is the base with the adapter off)
  async         the recipe + rollout.max_staleness=1 (a sampler process beside the trainer, one thread each)
  vllm          the recipe with rollout.engine=vllm (vLLM's CPU build, prefix caching) instead of hf's prefill
Writes runs/<run>/speed.{json,md}: seconds per step by phase, samples per hour, and each against the recipe.
"""
from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

from rlft.experiments import rlft_command

CONFIGS = {
    "recipe": [],
    "plain": ["train.share_prompt=false", "rollout.hf_share_prefill=false"],
    "shared": ["rollout.hf_share_prefill=false"],
    "micro8": ["train.micro_batch_per_device=8"],
    "lora": ["model.lora.rank=16"],
    "async": ["rollout.max_staleness=1"],
    "vllm": ["rollout.engine=vllm", "rollout.hf_share_prefill=false", "rollout.hf_cache=static"],  # hf-only options off
}
PHASES = ("time/sample_s", "time/logprobs_s", "time/update_s", "time/step_s")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--sft", required=True, help="the SFT model GRPO starts from")
    p.add_argument("--run", default="smollm2_speed")
    p.add_argument("--configs", default=",".join(CONFIGS))
    p.add_argument("--steps", type=int, default=6)
    p.add_argument("overrides", nargs="*", help="overrides for every configuration (after --)")
    args = p.parse_args()
    root = Path("runs") / args.run
    results = json.loads((root / "speed.json").read_text()) if (root / "speed.json").is_file() else {}
    for name in args.configs.split(","):
        out = root / name
        if name not in results:
            cmd = ["train", "experiment=smollm2_grpo", f"run.dir={out}", f"model.path={Path(args.sft).resolve()}",
                   f"train.max_steps={args.steps}", "algo.eval_every=0", "train.save_every=0", "logger.progress=false",
                   "overwrite=true", *CONFIGS[name], *args.overrides]
            rlft_command(cmd, root / "logs" / f"{name}.log", tag="speed")
            results[name] = measure(out)
            root.mkdir(parents=True, exist_ok=True)
            (root / "speed.json").write_text(json.dumps(results, indent=1))
        print(f"[speed] {name}: {results[name]['time/step_s']:.1f} s a step, "
              f"{results[name]['samples_per_hour']:.0f} samples/hour", flush=True)
    write_table(root, results)


def measure(out: Path) -> dict:
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in records if "time/step_s" in r][1:]  # the first step warms up
    result = {key: statistics.median(r[key] for r in steps) for key in PHASES}
    samples = steps[-1]["samples_seen"] - steps[0]["samples_seen"]
    per_step = samples / max(len(steps) - 1, 1)
    result.update(samples_per_step=per_step, samples_per_hour=per_step * 3600 / result["time/step_s"],
                  steps_measured=len(steps), reward=statistics.mean(r["reward"] for r in steps))
    return result


def write_table(root: Path, results: dict) -> None:
    lines = ["| configuration | sample s | log-prob s | update s | step s | samples/hour | vs recipe |",
             "|---|---|---|---|---|---|---|"]
    base = results.get("recipe", {}).get("samples_per_hour")
    for name, r in results.items():
        ratio = f"{r['samples_per_hour'] / base:.2f}x" if base else ""
        lines.append(f"| {name} | {r['time/sample_s']:.1f} | {r['time/logprobs_s']:.1f} | {r['time/update_s']:.1f} | "
                     f"{r['time/step_s']:.1f} | {r['samples_per_hour']:.0f} | {ratio} |")
    (root / "speed.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
