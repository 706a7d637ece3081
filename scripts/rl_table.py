#!/usr/bin/env python3
"""Every RL algorithm at an equal budget of training samples, several seeds, one table.

    python scripts/rl_table.py                                  # budget 25,600, seeds 0,1,2
    python scripts/rl_table.py --budget 6144 --jobs 2 --rows grpo,ppo,p3o_joint
    python scripts/rl_table.py --dry-run                         # the commands, nothing run
    python scripts/rl_table.py --rows grpo,distill,distill_outcome --teacher runs/big/grpo/final --budget 12800

One SFT model, and the outcome RM and PRM the chosen rows read (both trained on the SFT model's own
samples, labelled by the answer verifier and the exact step checker) are trained first, unless complete.
The distill rows learn from a teacher model given with --teacher (another run's model). Then every row
is trained from that SFT model once per seed with `train.max_samples=<budget>`: each online
algorithm samples that many completions (rollouts x prompts x samples per prompt), offline RFT
samples that many from the SFT model and trains on that many sequences, offline DPO trains on that
many sequences (budget / 2 preference pairs). Every run is evaluated on the same held-out problems
(greedy accuracy, maj@8, pass@8, reward and KL to the SFT model of its own samples).

Runs go to runs/<run>/table/<row>/s<seed>/, evaluations to runs/<run>/eval/<row>-s<seed>/. Finished
trainings and evaluations are not redone, so an interrupted table resumes where it stopped. Writes
runs/<run>/rl_table.{md,csv}: mean ± std over seeds, the gain over SFT, the samples each run saw, and the
held-out problems the row's runs fixed / broke against the SFT model (summed over seeds, one-sided sign test).

Overrides after `--` go to every rlft command; --rl-arg to the row trainings, --parent-arg to the
SFT/RM/PRM trainings (`rm,prm:key=value` for some of them). --jobs N runs N trainings at once (the RM beside
the PRM, then the rows), each on one CPU thread.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
import zlib
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from rlft.experiments import rlft_command
from rlft.files.handoff import read_manifest

# The reward models learn from the SFT model's own samples (docs/algorithms.md §2), with the data and
# steps that took them past 0.85 held-out accuracy on those samples (docs/results.md: RM pair accuracy
# 0.887, PRM balanced step accuracy 0.861; about an hour and 25 minutes on 2 cores).
PARENTS = {
    "sft": ["algo=sft"],
    "rm": ["algo=rm", "algo.source=policy", "algo.num_prompts=16000", "rollout.samples_per_prompt=8",
           "train.max_steps=6000", "algo.eval_every=1500"],
    "prm": ["algo=prm", "algo.source=policy", "algo.num_prompts=16000", "rollout.samples_per_prompt=4",
            "train.max_steps=6000", "algo.eval_every=1500"],
}

# Iterative RL as measured best (docs/results.md): the PRM retrains after each of 10 iterations on 512
# incorrect and 512 correct samples of that iteration, labelled by the exact step checker, 10% replay;
# the SFT model stays the KL reference.
ITERATIVE = ["iterative.iterations=10", "iterative.step_labels=exact", "iterative.label_budget=512",
             "iterative.rm_steps=150", "iterative.reset_reference=false"]


def rows(budget: int) -> dict[str, list[str]]:
    """Row name -> the overrides of its training (each preset as shipped)."""
    return {
        "grpo": ["algo=grpo"],
        "grpo_process": ["algo=grpo_process"],
        "grpo_process_exact": ["algo=grpo", "algo.advantage=grpo_process", "reward.process=exact"],
        # process and outcome supervision together: the verified answer anchors the PRM's step scores
        "grpo_process_outcome": ["algo=grpo", "algo.advantage=grpo_process", "algo.outcome_weight=1.0"],
        "grpo_iterative": ["algo=grpo_process", "algo.kl_coef=0.5", *ITERATIVE],
        # outcome supervision by the learned RM, at the process preset's beta: outcome vs process, both learned
        "grpo_rm": ["algo=grpo", "reward=rm", "algo.kl_coef=1.0"],
        "online_rft": ["algo=online_rft"],
        "rft": ["algo=rft", f"algo.num_prompts={budget // 8}", "rollout.samples_per_prompt=8"],
        "ppo": ["algo=ppo"],
        "p3o_joint": ["algo=p3o", "algo.pairwise_loss=p3o_joint"],
        "p3o_separate": ["algo=p3o", "algo.pairwise_loss=p3o_separate"],
        "dpo": ["algo=dpo"],
        # offline DPO on the SFT model's own samples (a correct over an incorrect one), sampled as offline RFT's
        "dpo_policy": ["algo=dpo", "algo.source=policy", f"algo.num_prompts={budget // 8}"],
        "online_dpo": ["algo=online_dpo"],
        "rloo": ["algo=rloo"],
        "reinforce_pp": ["algo=reinforce_pp"],
        # on-policy distillation from --teacher: alone, and with the outcome reward's GRPO advantage beside it
        "distill": ["algo=distill"],
        "distill_outcome": ["algo=distill", "algo.outcome_weight=1.0"],
    }


# The reward models a row reads (the others train from the SFT model and the rule reward alone).
ROW_PARENTS = {"grpo_process": ("prm",), "grpo_process_outcome": ("prm",), "grpo_iterative": ("prm",),
               "grpo_rm": ("rm",), "ppo": ("rm",)}
TEACHER_ROWS = ("distill", "distill_outcome")


class Runner:
    def __init__(self, args, common: list[str]):
        self.args, self.common = args, common
        self.root = args.root / args.run

    def rlft(self, *cmd: str) -> None:
        line = "rlft " + " ".join(cmd)
        if self.args.dry_run:
            print(line, flush=True)
            return
        rlft_command(list(cmd), self.root / "logs" / f"{zlib.crc32(line.encode()):08x}.log", tag="rl_table")

    def threads(self) -> list[str]:
        return ["deepspeed.threads_per_rank=1"] if self.args.jobs > 1 else []

    def parent(self, name: str) -> None:
        if read_manifest(self.root / name) is None:
            preset = PARENTS[name] if self.args.reward_data == "policy" else PARENTS[name][:1]
            self.rlft("train", *preset, *self.threads(), *self.common, *scoped_args(self.args.parent_arg, name))

    def train_and_eval(self, row: str, overrides: list[str], seed: int) -> None:
        out = self.root / "table" / row / f"s{seed}"
        if read_manifest(out) is not None:
            budget = trained_budget(out)
            if budget != self.args.budget:
                raise SystemExit(f"rl_table: {out} was trained with train.max_samples={budget}, not --budget "
                                 f"{self.args.budget}; use another --run for another budget")
        else:
            self.rlft("train", *overrides, f"train.max_samples={self.args.budget}", f"seed={seed}", f"run.dir={out}",
                      *self.threads(), *self.common, *scoped_args(self.args.rl_arg, row))
        self.evaluate(out / "final", f"{row}-s{seed}")

    def evaluate(self, model: Path | str, tag: str) -> None:
        if not (self.root / "eval" / tag / "eval.json").is_file():
            self.rlft("eval", f"model.path={model}", f"eval.tag={tag}", "eval.reference=stage:sft",
                      f"eval.num_problems={self.args.eval_problems}", *self.threads(), *self.common)


def trained_budget(stage_dir: Path) -> int:
    """train.max_samples of a finished run (its resolved config)."""
    from omegaconf import OmegaConf

    return int(OmegaConf.select(OmegaConf.load(stage_dir / "config.yaml"), "train.max_samples", default=0))


def scoped_args(specs: list[str], name: str) -> list[str]:
    """The --parent-arg or --rl-arg overrides for one parent or row: `key=value` for all, `rm,prm:key=value`
    (`dpo,rft:key=value`) for those named."""
    out = []
    for spec in specs:
        head, sep, override = spec.partition(":")
        if sep and "=" not in head:
            if name in head.split(","):
                out.append(override)
        else:
            out.append(spec)
    return out


def samples_seen(root: Path, names: list[str], seeds: list[int]) -> dict[str, float]:
    out = {}
    for row in names:
        for s in seeds:
            manifest = root / "table" / row / f"s{s}" / "manifest.json"
            if manifest.is_file():
                summary = json.loads(manifest.read_text()).get("summary", {})
                if "samples_seen" in summary:
                    out[f"{row}-s{s}"] = summary["samples_seen"]
    return out


def write_results(root: Path, names: list[str], seeds: list[int]) -> str:
    from rlft.eval.compare import load_records, paired_cell, seed_table, write_table

    paired = {row: paired_cell([(root / "eval" / "sft", root / "eval" / f"{row}-s{s}") for s in seeds])
              for row in names}
    lines = seed_table(load_records(root / "eval"), samples_seen(root, names, seeds), names, seeds, "sft",
                       paired=paired)
    return write_table(root / "rl_table", *lines)


def main(argv: list[str]) -> None:
    extra = argv[argv.index("--") + 1:] if "--" in argv else []
    argv = argv[:argv.index("--")] if "--" in argv else argv
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--run", default="rl_table", help="run name (runs/<run>/...)")
    p.add_argument("--root", type=Path, default=Path("runs"), help="run.root")
    p.add_argument("--budget", type=int, default=25600, help="training samples per run (train.max_samples)")
    p.add_argument("--seeds", default="0,1,2", help="comma-separated seeds of every row")
    p.add_argument("--rows", default="", help="comma-separated rows (default: all)")
    p.add_argument("--jobs", type=int, default=1, help="trainings/evaluations at once (one CPU thread each)")
    p.add_argument("--eval-problems", type=int, default=200, help="held-out problems per evaluation")
    p.add_argument("--rl-arg", action="append", default=[],
                   help="an override for the row trainings only; `dpo,rft:key=value` for some rows "
                   "(e.g. train.batch_size, which only the offline rows read)")
    p.add_argument("--parent-arg", action="append", default=[],
                   help="an override for the SFT/RM/PRM trainings; `rm,prm:key=value` for some of them")
    p.add_argument("--reward-data", choices=["policy", "data"], default="policy",
                   help="what the RM and PRM learn from: the SFT model's samples, or the data's pairs/step labels")
    p.add_argument("--teacher", default="", help="the distill rows' teacher (teacher.path: a model folder, e.g. "
                   "another run's runs/<run>/grpo/final)")
    p.add_argument("--dry-run", action="store_true", help="print the commands, run nothing")
    args = p.parse_args(argv)
    table = rows(args.budget)
    names = [r for r in args.rows.split(",") if r] or [r for r in table if args.teacher or r not in TEACHER_ROWS]
    unknown = [r for r in names if r not in table]
    if unknown:
        raise SystemExit(f"rl_table: unknown row(s) {', '.join(unknown)}; valid: {', '.join(table)}")
    if any(r in TEACHER_ROWS for r in names) and not args.teacher:
        raise SystemExit("rl_table: the distill rows need a teacher: --teacher <model folder>")
    if args.teacher:  # a folder as an absolute path: the runs start in other directories
        teacher = Path(args.teacher).resolve() if Path(args.teacher).exists() else args.teacher
        for row in TEACHER_ROWS:
            table[row].append(f"teacher.path={teacher}")
    seeds = [int(s) for s in args.seeds.split(",") if s]
    runner = Runner(args, [f"run.name={args.run}", f"run.root={args.root}", *extra])
    tic = time.time()
    runner.parent("sft")
    needed = sorted({parent for row in names for parent in ROW_PARENTS.get(row, ())})
    with ThreadPoolExecutor(max_workers=max(args.jobs, 1)) as pool:
        # the RM and the PRM both learn from the SFT model's samples only: they train side by side
        for future in [pool.submit(runner.parent, name) for name in needed]:
            future.result()
    runner.evaluate("stage:sft", "sft")
    jobs = [(row, seed) for seed in seeds for row in names]
    with ThreadPoolExecutor(max_workers=max(args.jobs, 1)) as pool:
        for future in [pool.submit(runner.train_and_eval, row, table[row], seed) for row, seed in jobs]:
            future.result()
    if args.dry_run:
        return
    print(write_results(runner.root, names, seeds))
    print(f"[rl_table] wrote {runner.root / 'rl_table.md'} ({time.time() - tic:.0f} s)")


if __name__ == "__main__":
    main(sys.argv[1:])
