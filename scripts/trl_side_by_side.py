#!/usr/bin/env python3
"""TRL's GRPOTrainer on the run rlft's GRPO recipe makes: the same starting model, task rows, reward, learning
rate, group size, prompts per step, lengths, KL and steps; the result evaluated by `rlft eval` on the same
held-out problems, so one table holds both tools' accuracy and wall time.

    python scripts/trl_side_by_side.py --model runs/t/chain_sum/sft_s0/final --out runs/trl/chain_sum_s0 \\
        --seed 0 -- experiment=smollm2_grpo train.lr=2e-6 rollout.prompts_per_step=16 train.max_steps=80

Everything after `--` is an rlft override list: the script composes rlft's config from it and reads the settings
from there (`train.lr`, `train.max_steps`, `train.warmup_steps`, `train.adam_beta1/2`, `train.weight_decay`,
`train.grad_clip`, `rollout.prompts_per_step`, `rollout.samples_per_prompt`, `rollout.max_new_tokens`,
`rollout.temperature`, `algo.kl_coef`, `algo.clip_eps_low/high`, `deepspeed.activation_checkpointing` as TRL's
`gradient_checkpointing`), so both sides run the same numbers. The environment (its training rows, its
chat-template prompts and its scorer) is rlft's, called from TRL's reward function. TRL's loss is set to
rlft's default aggregation (loss_type="grpo": each completion's token mean, averaged over completions) with
group-std scaling, as rlft's `grpo` advantage does.

What differs and cannot be made equal: the order in which prompts are drawn (TRL's sampler and rlft's seeded
shuffles), the warm-up's first rate (TRL from 0, rlft from train.min_lr_ratio x lr), and TRL's generation and
forward code. Writes <out>/final (the trained model), <out>/trl.json (settings, wall time = the sum of the step
times, per-step reward), then runs `rlft eval` on it unless --no-eval. A checkpoint every --save-every steps
(<out>/trl/checkpoint-N, the last one kept): rerunning the same command resumes there.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from rlft.experiments import rlft_command


def rlft_config(overrides: list[str]):
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    from rlft.config.schema import register_schemas
    from rlft.config.validate import validate
    from rlft.overrides import conf_dir, replace_dicts

    register_schemas()
    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(conf_dir()), version_base="1.3"):
        cfg = compose("config", overrides=replace_dicts(overrides))
    validate(cfg)
    return cfg


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", required=True, help="the starting model (the SFT model rlft's GRPO starts from)")
    p.add_argument("--out", required=True)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=0, help="torch threads (0: all cores)")
    p.add_argument("--no-eval", action="store_true")
    p.add_argument("--save-every", type=int, default=10, help="optimizer steps between checkpoints (a rerun of the "
                   "same command resumes from the last)")
    p.add_argument("overrides", nargs="*", help="rlft overrides (after --) that define the run")
    args = p.parse_args()
    out = Path(args.out)
    if not (out / "final" / "config.json").is_file():
        train(args, out)
    if not args.no_eval:
        evaluate(args, out)


def train(args, out: Path) -> None:
    import torch
    from datasets import Dataset
    from transformers import AutoTokenizer, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    from rlft import envs

    if args.threads:
        torch.set_num_threads(args.threads)
    cfg = rlft_config([*args.overrides, f"seed={args.seed}", f"model.path={args.model}"])
    tok = AutoTokenizer.from_pretrained(args.model)
    env = envs.build(cfg, tok)
    rows = env.rows("train")
    instruction = [{"role": "user", "content": r["prompt"]} for r in rows]  # the chat template turns it into text
    data = Dataset.from_dict({"prompt": [[m] for m in instruction], "row": list(range(len(rows)))})
    rewards: list[float] = []

    def task_reward(prompts, completions, row, **unused):
        texts = [c[0]["content"] if isinstance(c, list) else c for c in completions]
        scores = [env.score(rows[i], t).reward for i, t in zip(row, texts)]
        rewards.extend(scores)
        return scores

    class Clock(TrainerCallback):
        """Each optimizer step's time and mean reward, appended to <out>/steps.jsonl as it ends (a resumed run
        keeps the steps before its checkpoint; the steps after it are trained, and written, again)."""

        def __init__(self, log: Path):
            self.log, self.mark = log, 0

        def on_train_begin(self, unused_args, state, *unused, **kw):
            kept = [json.loads(line) for line in self.log.read_text().splitlines()] if self.log.is_file() else []
            self.log.write_text("".join(json.dumps(r) + "\n" for r in kept[:state.global_step]))

        def on_step_begin(self, *unused, **kw):
            self.tic = time.perf_counter()

        def on_step_end(self, unused_args, state, *unused, **kw):
            batch, self.mark = rewards[self.mark:], len(rewards)
            record = {"step": state.global_step, "step_s": time.perf_counter() - self.tic,
                      "reward": sum(batch) / max(len(batch), 1)}
            with open(self.log, "a") as f:
                f.write(json.dumps(record) + "\n")
            print(f"[trl] step {record['step']}/{cfg.train.max_steps}: {record['step_s']:.1f}s reward "
                  f"{record['reward']:.3f}", file=sys.stderr, flush=True)

    n = cfg.rollout.prompts_per_step * cfg.rollout.samples_per_prompt
    micro = int(cfg.train.micro_batch_per_device)
    train_cfg = cfg.train
    config = GRPOConfig(
        output_dir=str(out / "trl"), per_device_train_batch_size=micro, gradient_accumulation_steps=n // micro,
        num_generations=cfg.rollout.samples_per_prompt, steps_per_generation=n // micro, num_iterations=1,
        max_completion_length=cfg.rollout.max_new_tokens, temperature=cfg.rollout.temperature, top_p=1.0, top_k=0,
        beta=cfg.algo.kl_coef, epsilon=cfg.algo.clip_eps_low, epsilon_high=cfg.algo.clip_eps_high,
        loss_type="grpo", scale_rewards="group", learning_rate=train_cfg.lr, lr_scheduler_type="constant_with_warmup",
        warmup_steps=train_cfg.warmup_steps, weight_decay=train_cfg.weight_decay, adam_beta1=train_cfg.adam_beta1,
        adam_beta2=train_cfg.adam_beta2, max_grad_norm=train_cfg.grad_clip, max_steps=train_cfg.max_steps,
        logging_steps=10**6, save_strategy="steps", save_steps=args.save_every, save_total_limit=1, report_to=[],
        bf16=False, use_cpu=not torch.cuda.is_available(), dataloader_num_workers=0, seed=args.seed,
        model_init_kwargs={"dtype": torch.float32},
        gradient_checkpointing=bool(cfg.deepspeed.activation_checkpointing))  # TRL's default is on; rlft's is the config's
    clock = Clock(out / "steps.jsonl")
    trainer = GRPOTrainer(model=args.model, reward_funcs=task_reward, args=config, train_dataset=data,
                          processing_class=tok, callbacks=[clock])
    resume = any((out / "trl").glob("checkpoint-*"))  # an interrupted run continues from its last checkpoint
    trainer.train(resume_from_checkpoint=True if resume else None)
    steps = [json.loads(line) for line in (out / "steps.jsonl").read_text().splitlines()]
    wall = sum(r["step_s"] for r in steps)
    trainer.save_model(str(out / "final"))
    tok.save_pretrained(str(out / "final"))
    settings = {k: getattr(config, k) for k in ("learning_rate", "num_generations", "per_device_train_batch_size",
                                                "gradient_accumulation_steps", "max_completion_length", "beta",
                                                "loss_type", "scale_rewards", "max_steps", "warmup_steps",
                                                "adam_beta2", "temperature", "gradient_checkpointing")}
    record = {"tool": "trl", "seed": args.seed, "model": args.model, "overrides": args.overrides,
              "settings": settings, "samples": n * train_cfg.max_steps, "wall_s": wall, "steps": steps}
    (out / "trl.json").write_text(json.dumps(record, indent=1, default=str))
    print(f"[trl] {train_cfg.max_steps} steps, {n * train_cfg.max_steps} samples in {wall / 60:.1f} min", flush=True)


def evaluate(args, out: Path) -> None:
    """`rlft eval` of the trained model with the recipe's evaluation (greedy and pass@4 on 200 held-out problems)."""
    evals = ["eval.samples=4", "eval.k=[1,4]", "eval.num_problems=200", "eval.reference=none", "eval.rm=none",
             "eval.policy_samples=0", "logger.progress=false"]
    task = [o for o in args.overrides if o.startswith(("env", "data"))]
    rlft_command(["eval", "experiment=smollm2_sft", f"run.dir={out}", f"model.path={(out / 'final').resolve()}",
                  f"eval.tag={out.name}", f"run.root={out.parent}", f"run.name={out.name}", *task, *evals], tag="trl")


if __name__ == "__main__":
    main()
