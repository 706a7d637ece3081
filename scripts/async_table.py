#!/usr/bin/env python3
"""Asynchronous GRPO against the synchronous loop at equal samples: held-out accuracy, speed and overlap.

    python scripts/async_table.py                          # K = 0, 1, 2; seeds 0, 1, 2; 12,800 samples
    python scripts/async_table.py --staleness 0,1 --seeds 0 --budget 6400
    python scripts/async_table.py --dry-run                # the commands, nothing run

One SFT model (the sft preset on the built-in task), then GRPO from it per K and seed with
`train.max_samples=<budget>`. K = 0 trains on all `--threads` CPU threads; K > 0 gives the trainer and the
sampler process half each (`deepspeed.threads_per_rank`, `rollout.sampler_threads`). Every model is
evaluated on the same held-out problems (greedy accuracy). From each run's metrics: seconds per rollout
(time/step_s, the first rollout left out), the trainer's wait for the sampler (time/sample_s), the
sampler's own seconds per rollout (time/sampler_busy_s) and the overlap, the share of a step during which
both were busy: (sampler seconds - wait) / step seconds.

Runs go to runs/<run>/{sft,k<K>-s<seed>}/, evaluations to runs/<run>/eval/; finished ones are not redone.
Writes runs/<run>/async_table.{md,csv}. Overrides after `--` go to every rlft command.
"""
from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

from rlft.experiments import cell, rlft_command


def timing(run_dir: Path) -> dict:
    records = [json.loads(line) for line in open(run_dir / "metrics.jsonl") if '"time/step_s"' in line]
    steady = records[1:] or records
    step = statistics.mean(r["time/step_s"] for r in steady)
    wait = statistics.mean(r["time/sample_s"] for r in steady)
    busy = statistics.mean(r.get("time/sampler_busy_s", 0.0) for r in steady)
    return {"step_s": step, "wait_s": wait, "sampler_s": busy,
            "overlap": max(0.0, busy - wait) / step if busy else 0.0,
            "staleness": statistics.mean(r.get("staleness_mean", 0.0) for r in records)}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--run", default="async_table")
    p.add_argument("--staleness", default="0,1,2")
    p.add_argument("--seeds", default="0,1,2")
    p.add_argument("--budget", type=int, default=12800, help="GRPO training samples per run")
    p.add_argument("--threads", type=int, default=2, help="CPU threads per run (K > 0: half each side)")
    p.add_argument("--eval-problems", type=int, default=200)
    p.add_argument("--dry-run", action="store_true")
    p.add_argument("overrides", nargs="*")
    args = p.parse_args()
    ks, seeds = [int(k) for k in args.staleness.split(",")], [int(s) for s in args.seeds.split(",")]
    root = Path("runs") / args.run
    rlft: list[str] = []  # rlft_command adds `python -m rlft.cli`
    common = [f"run.name={args.run}", "logger.progress=false", *args.overrides]

    def stage(out: Path, cmd: list[str], done: str = "manifest.json") -> None:
        if args.dry_run:
            print("rlft " + " ".join(cmd))
        elif not (out / done).is_file():
            rlft_command(cmd, out.with_name(out.name + ".log"), tag="async_table")

    sft = root / "sft"
    stage(sft, rlft + ["train", "algo=sft", f"run.dir={sft}", f"deepspeed.threads_per_rank={args.threads}", *common])
    rows = []
    for k in ks:
        for seed in seeds:
            out = root / f"k{k}-s{seed}"
            threads = [f"deepspeed.threads_per_rank={args.threads}"] if k == 0 else \
                [f"deepspeed.threads_per_rank={max(1, args.threads // 2)}",
                 f"rollout.sampler_threads={max(1, args.threads // 2)}", f"rollout.max_staleness={k}"]
            stage(out, rlft + ["train", "algo=grpo", f"run.dir={out}", f"model.path={sft / 'final'}", f"seed={seed}",
                               f"train.max_samples={args.budget}", *threads, *common])
            evaluated = root / "eval" / out.name
            stage(evaluated, rlft + ["eval", f"model.path={out / 'final'}", f"eval.tag={out.name}", "eval.samples=1",
                                     "eval.k=[1]", f"eval.num_problems={args.eval_problems}",
                                     f"deepspeed.threads_per_rank={args.threads}", *common], done="eval.json")
            if not args.dry_run:
                rows.append({"k": k, "seed": seed, **timing(out),
                             "greedy": json.loads((evaluated / "eval.json").read_text())["metrics"]["greedy_accuracy"]})
    if args.dry_run:
        return
    lines = ["| K | greedy % (held-out) | s / rollout | rollouts / hour | trainer waits, s | sampler busy, s | overlap % |",
             "|---|---|---|---|---|---|---|"]
    for k in ks:
        mine = [r for r in rows if r["k"] == k]
        lines.append(f"| {k} | {cell([r['greedy'] for r in mine], 100)} | {cell([r['step_s'] for r in mine], 1, 2)} | "
                     f"{cell([3600 / r['step_s'] for r in mine], 1, 0)} | {cell([r['wait_s'] for r in mine], 1, 2)} | "
                     f"{cell([r['sampler_s'] for r in mine], 1, 2)} | {cell([r['overlap'] for r in mine], 100)} |")
    (root / "async_table.md").write_text("\n".join(lines) + "\n")
    keys = ["k", "seed", "greedy", "step_s", "wait_s", "sampler_s", "overlap", "staleness"]
    (root / "async_table.csv").write_text("\n".join([",".join(keys)] + [",".join(str(r[c]) for c in keys)
                                                                         for r in rows]) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
