#!/usr/bin/env python3
"""SFT and GRPO through each environment on the built-in tiny model, several seeds, one table.

    python scripts/env_table.py                                   # math vs calculator, seeds 0,1,2
    python scripts/env_table.py --rows gym_chain_sum,gym_basic_arithmetic --jobs 2
    python scripts/env_table.py --dry-run                          # the commands, nothing run

Each row is an environment (its overrides below). Its SFT model trains once on the environment's
demonstrations; GRPO trains from it once per seed with `train.max_samples=<budget>` (equal samples
for every row); every model is evaluated on the environment's held-out rows (greedy accuracy,
pass@8, maj@8 and, for tool environments, how the samples used the tool). From the greedy
completions the table also counts arithmetic slips: calculation lines `a op b = c` (or calculator
calls `<<a op b=c>>`) whose written result is not the value of the written expression, and, problem
by problem, the held-out problems the GRPO runs fixed and broke against the SFT model (summed over
seeds, with a one-sided sign test).

Runs go to runs/<run>/envs/<row>/{sft,s<seed>}/, evaluations to runs/<run>/eval/<row>-{sft,s<seed>}/;
finished ones are not redone. Writes runs/<run>/env_table.{md,csv}. Overrides after `--` go to every
rlft command.
"""
from __future__ import annotations

import argparse
import json
import re
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from rlft.eval.compare import paired_cell
from rlft.experiments import cell, rlft_command
from rlft.files.handoff import read_manifest

ROWS = {
    "math": ["env=math"],
    "calculator": ["env=calculator"],
    "gym_chain_sum": ["env=reasoning_gym", "env.task=chain_sum", "env.task_config={min_terms:2,max_terms:3,"
                      "min_digits:1,max_digits:2}"],
    "gym_basic_arithmetic": ["env=reasoning_gym", "env.task=basic_arithmetic",
                             "env.task_config={min_terms:2,max_terms:3,min_digits:1,max_digits:2}"],
    "gym_chain_sum_1d": ["env=reasoning_gym", "env.task=chain_sum", "env.task_config={min_terms:2,max_terms:3,"
                         "min_digits:1,max_digits:1}"],
    "gym_basic_arithmetic_1d": ["env=reasoning_gym", "env.task=basic_arithmetic",
                                "env.task_config={min_terms:2,max_terms:3,min_digits:1,max_digits:1}"],
    "gym_spell_backward": ["env=reasoning_gym", "env.task=spell_backward",
                           "env.task_config={min_word_len:3,max_word_len:5}"],
    "gym_letter_counting": ["env=reasoning_gym", "env.task=letter_counting",
                            "env.task_config={min_words:3,max_words:5}"],
    "gym_simple_equations": ["env=reasoning_gym", "env.task=simple_equations",
                             "env.task_config={min_terms:2,max_terms:2,min_value:1,max_value:10}"],
    "gym_word_sequence_reversal": ["env=reasoning_gym", "env.task=word_sequence_reversal",
                                   "env.task_config={min_words:2,max_words:4}"],
    "gym_complex_arithmetic": ["env=reasoning_gym", "env.task=complex_arithmetic",
                               "env.task_config={min_real:-5,max_real:5,min_imag:-5,max_imag:5}"],
    "gym_decimal_chain_sum": ["env=reasoning_gym", "env.task=decimal_chain_sum",
                              "env.task_config={min_terms:2,max_terms:2,min_digits:1,max_digits:1,"
                              "min_decimal_places:1,max_decimal_places:1}"],
    "gym_leg_counting": ["env=reasoning_gym", "env.task=leg_counting",
                         "env.task_config={min_animals:1,max_animals:2,min_instances:1,max_instances:4}"],
    "gym_base_conversion": ["env=reasoning_gym", "env.task=base_conversion",
                            "env.task_config={min_base:2,max_base:10,min_value:0,max_value:60}"],
    # tasks with many right answers (any expression that reaches the target, any palindrome of the letters):
    # the demonstrations show one, the reward accepts all; their prompts need a longer train.max_seq_len
    "gym_countdown": ["env=reasoning_gym", "env.task=countdown", "train.max_seq_len=448",
                      "env.task_config={min_numbers:3,max_numbers:3,min_value:1,max_value:9,min_target:10,"
                      "max_target:50}"],
    "gym_palindrome_generation": ["env=reasoning_gym", "env.task=palindrome_generation", "train.max_seq_len=448",
                                  "env.task_config={min_length:3,max_length:5}"],
    "python": ["env=python", "env.instruction=", "rollout.max_new_tokens=128"],
}
CALC_LINE = re.compile(r"(?:<<)?\s*([-+*/().\d\s]*\d[-+*/().\d\s]*?)\s*=\s*(-?\d+(?:\.\d+)?)(?:>>)?\s*")


def arithmetic_slips(text: str) -> tuple[int, int]:
    """(calculation lines whose result is wrong, calculation lines) in one completion."""
    from rlft.envs.calculator import CalcError, evaluate

    wrong = total = 0
    for line in text.split("\n"):
        m = CALC_LINE.fullmatch(line.strip())
        if not m:
            continue
        try:
            value = evaluate(m.group(1))
        except (CalcError, ZeroDivisionError, ValueError):
            continue
        total += 1
        wrong += value != float(m.group(2))
    return wrong, total


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--run", default="env_table")
    p.add_argument("--rows", default="math,calculator")
    p.add_argument("--seeds", default="0,1,2")
    p.add_argument("--budget", type=int, default=12800, help="GRPO training samples per run")
    p.add_argument("--eval-problems", type=int, default=200)
    p.add_argument("--jobs", type=int, default=1)
    p.add_argument("--variants", default="", help="GRPO variants beside the preset, name=override;override;... "
                   "(e.g. pool=rollout.pool.enabled=true;env.train_size=800): each its own runs from the same SFT "
                   "model, s<seed>-<name>, and its own rows in the table")
    p.add_argument("--dry-run", action="store_true")
    p.add_argument("overrides", nargs="*")
    args = p.parse_args()
    rows = args.rows.split(",")
    unknown = [r for r in rows if r not in ROWS]
    if unknown:
        raise SystemExit(f"unknown row {unknown[0]!r}; valid: {', '.join(ROWS)}")
    seeds = [int(s) for s in args.seeds.split(",")]
    root = Path("runs") / args.run
    rlft: list[str] = []  # rlft_command adds `python -m rlft.cli`
    common = [f"run.name={args.run}", "logger.progress=false", "deepspeed.threads_per_rank=1", *args.overrides]
    evals = ["eval.samples=8", "eval.k=[1,8]", f"eval.num_problems={args.eval_problems}"]

    def sft(row):
        out = root / "envs" / row / "sft"
        return out, rlft + ["train", "algo=sft", f"run.dir={out}", *ROWS[row], *common]

    variants = {"": []}
    for spec in filter(None, args.variants.split(",")):
        name, _, extra = spec.partition("=")
        variants[name] = [o for o in extra.split(";") if o]

    def grpo(row, seed, variant=""):
        out = root / "envs" / row / (f"s{seed}" + (f"-{variant}" if variant else ""))
        return out, rlft + ["train", "algo=grpo", f"run.dir={out}",
                            f"model.path={root / 'envs' / row / 'sft' / 'final'}",
                            f"seed={seed}", f"train.max_samples={args.budget}", *ROWS[row], *common,
                            *variants[variant]]

    def evaluate(row, name, model):
        return rlft + ["eval", f"model.path={model}", f"eval.tag={row}-{name}", *ROWS[row], *evals, *common]

    def stage(out: Path, cmd: list[str]):
        if args.dry_run:
            print("rlft " + " ".join(cmd))
        elif read_manifest(out) is None:
            rlft_command(cmd, out.with_name(out.name + ".log"), tag="env_table")

    def evaluated(row, name, model):
        out = root / "eval" / f"{row}-{name}"
        if args.dry_run:
            print("rlft " + " ".join(evaluate(row, name, model)))
        elif not (out / "eval.json").is_file():
            rlft_command(evaluate(row, name, model), root / "logs" / f"eval-{row}-{name}.log", tag="env_table")

    with ThreadPoolExecutor(max_workers=args.jobs) as pool:
        list(pool.map(lambda r: stage(*sft(r)), rows))
        jobs = [pool.submit(evaluated, r, "sft", sft(r)[0] / "final") for r in rows]
        jobs += [pool.submit(lambda r, s, v: (stage(*grpo(r, s, v)), evaluated(r, grpo(r, s, v)[0].name,
                                                                               grpo(r, s, v)[0] / "final")), r, s, v)
                 for r in rows for s in seeds for v in variants]
        for j in jobs:
            j.result()
    if args.dry_run:
        return
    write_table(root, rows, seeds, list(variants))


def figures(root: Path, row: str, name: str) -> dict:
    out = root / "eval" / f"{row}-{name}"
    m = json.loads((out / "eval.json").read_text())["metrics"]
    slips = [arithmetic_slips(json.loads(line)["greedy"]["text"]) for line in open(out / "samples.jsonl")]
    wrong, total = sum(w for w, _ in slips), sum(t for _, t in slips)
    return {"greedy": m["greedy_accuracy"], "pass@8": m["pass@8"], "maj@8": m["maj@8"],
            "tool_use": m.get("tool_use_rate"), "slips": wrong / total if total else None}


def write_table(root: Path, rows: list[str], seeds: list[int], variants: list[str] = ("",)) -> None:
    head = ("| env | model | greedy % | pass@8 % | maj@8 % | tool use % | arithmetic slips % of lines | gain over SFT "
            "| fixed / broken vs SFT |")
    lines = [head, "|" + "---|" * 9]
    csv = ["env,model,greedy,pass@8,maj@8,tool_use,slips"]
    evals = root / "eval"
    for row in rows:
        base = figures(root, row, "sft")
        lines.append(f"| {row} | SFT | {cell([base['greedy']])} | {cell([base['pass@8']])} | {cell([base['maj@8']])} | "
                     f"{cell([base['tool_use']])} | {cell([base['slips']])} | | |")
        named = []
        for variant in variants:
            names = [f"s{s}" + (f"-{variant}" if variant else "") for s in seeds]
            runs = [figures(root, row, n) for n in names]
            named += list(zip(names, runs))
            gains = [r["greedy"] - base["greedy"] for r in runs]
            label = f"GRPO{f' {variant}' if variant else ''} ({len(seeds)} seeds)"
            lines.append(f"| {row} | {label} | {cell([r['greedy'] for r in runs])} | "
                         f"{cell([r['pass@8'] for r in runs])} | {cell([r['maj@8'] for r in runs])} | "
                         f"{cell([r['tool_use'] for r in runs])} | {cell([r['slips'] for r in runs])} | "
                         f"{cell(gains)} | {paired_cell([(evals / f'{row}-sft', evals / f'{row}-{n}') for n in names])} "
                         "|")
        for name, f in [("sft", base)] + named:
            csv.append(",".join([row, name] + ["" if f[k] is None else f"{f[k]:.4f}"
                                               for k in ("greedy", "pass@8", "maj@8", "tool_use", "slips")]))
    (root / "env_table.md").write_text("\n".join(lines) + "\n")
    (root / "env_table.csv").write_text("\n".join(csv) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
