#!/usr/bin/env python3
"""maj@K and pass@K for K = 1, 2, 4, ... before and after RL (DeepSeekMath §5.2.2, Fig. 7).

    python scripts/passk_curve.py                                  # runs/rl_table: sft against grpo
    python scripts/passk_curve.py --run rl_table --rows grpo,grpo_process_exact --kmax 64

Evaluates the run's SFT model and every seed of each row of scripts/rl_table.py
(runs/<run>/table/<row>/s<seed>/final) with `--kmax` samples per held-out problem at the evaluation
temperature, and the unbiased pass@K and maj@K estimators for every power of two up to kmax. Finished
evaluations (runs/<run>/eval/passk-<model>/eval.json) are not redone. Writes
runs/<run>/passk/passk.csv (one line per model and K, mean and std over seeds) and passk.png.

Overrides after `--` go to every `rlft eval` command.
"""
from __future__ import annotations

import argparse
import csv
import json
import sys
from pathlib import Path

from rlft.experiments import rlft_command


def ks_up_to(kmax: int) -> list[int]:
    ks, k = [], 1
    while k <= kmax:
        ks.append(k)
        k *= 2
    return ks


def evaluate(args, model: str, tag: str, ks: list[int], extra: list[str]) -> dict:
    record = args.root / args.run / "eval" / tag / "eval.json"
    if not record.is_file():
        cmd = ["eval", f"model.path={model}", f"eval.tag={tag}", f"eval.samples={args.kmax}",
               f"eval.k=[{','.join(map(str, ks))}]", f"eval.num_problems={args.eval_problems}", "eval.policy_samples=0",
               "eval.reference=none", "eval.rm=none", f"run.name={args.run}", f"run.root={args.root}", *extra]
        rlft_command(cmd, tag="passk")
    return json.loads(record.read_text())["metrics"]


def curve_rows(per_model: dict[str, list[dict]], ks: list[int]) -> list[dict]:
    """{model, k, pass, pass_std, maj, maj_std, seeds}: mean and std over each model's evaluations."""
    from rlft.eval.compare import mean_std

    out = []
    for name, records in per_model.items():
        for k in ks:
            p_mean, p_std = mean_std([m[f"pass@{k}"] for m in records])
            m_mean, m_std = mean_std([m[f"maj@{k}"] for m in records])
            out.append({"model": name, "k": k, "pass": p_mean, "pass_std": p_std, "maj": m_mean, "maj_std": m_std,
                        "seeds": len(records)})
    return out


def plot(rows: list[dict], path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(9.6, 4.0), sharey=True)
    for ax, metric in zip(axes, ("maj", "pass")):
        for name in dict.fromkeys(r["model"] for r in rows):
            line = [r for r in rows if r["model"] == name]
            ax.errorbar([r["k"] for r in line], [r[metric] for r in line], yerr=[r[metric + "_std"] for r in line],
                        marker="o", capsize=3, label=name)
        ax.set_xscale("log", base=2)
        ax.set_xlabel("K (samples per problem)")
        ax.set_title(f"{metric}@K (held-out)")
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("accuracy")
    axes[0].legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv: list[str]) -> None:
    extra = argv[argv.index("--") + 1:] if "--" in argv else []
    argv = argv[:argv.index("--")] if "--" in argv else argv
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--run", default="rl_table", help="the run of scripts/rl_table.py (runs/<run>/...)")
    p.add_argument("--root", type=Path, default=Path("runs"), help="run.root")
    p.add_argument("--rows", default="grpo", help="comma-separated rows of the table, each against the SFT model")
    p.add_argument("--kmax", type=int, default=64, help="samples per problem (the largest K)")
    p.add_argument("--eval-problems", type=int, default=200, help="held-out problems")
    args = p.parse_args(argv)
    ks = ks_up_to(args.kmax)
    per_model = {"sft": [evaluate(args, "stage:sft", "passk-sft", ks, extra)]}
    for row in [r for r in args.rows.split(",") if r]:
        finals = sorted((args.root / args.run / "table" / row).glob("s*/final"))
        if not finals:
            raise SystemExit(f"passk: no trained model under {args.root / args.run / 'table' / row}; run "
                             "scripts/rl_table.py first")
        per_model[row] = [evaluate(args, str(f), f"passk-{row}-{f.parent.name}", ks, extra) for f in finals]
    rows = curve_rows(per_model, ks)
    out = args.root / args.run / "passk"
    out.mkdir(parents=True, exist_ok=True)
    with open(out / "passk.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    plot(rows, out / "passk.png")
    names = list(per_model)
    print("| K | " + " | ".join(f"{n} maj@K | {n} pass@K" for n in names) + " |")
    print("|---|" + "---|---|" * len(names))
    for k in ks:
        cells = [r for n in names for r in rows if r["model"] == n and r["k"] == k]
        print(f"| {k} | " + " | ".join(f"{r['maj']:.3f} | {r['pass']:.3f}" for r in cells) + " |")
    print(f"[passk] wrote {out / 'passk.csv'} and {out / 'passk.png'}")


if __name__ == "__main__":
    main(sys.argv[1:])
