"""Held-out greedy accuracy against training samples, per row of an rl_table run, averaged over seeds.

    python scripts/rl_table.py --run d --rows grpo,distill --teacher <model> --rl-arg algo.eval_every=5
    python scripts/sample_curves.py --run d --rows grpo,distill,distill_outcome [--reference grpo]

Reads each run's metrics.jsonl (the evaluations the RL loop logs every algo.eval_every steps, on the
algo.eval_problems held-out problems, with the samples drawn so far) under runs/<run>/table/<row>/s<seed>/.
Writes runs/<run>/sample_curves.{csv,md,png}: the mean ± std over seeds at each evaluation, and for each row
the fewest samples at which its mean accuracy reaches the reference row's final mean accuracy (or --target,
e.g. a teacher's accuracy), as a share of the reference row's samples (the "fraction of GRPO's samples" a
method needs for GRPO's result), and the share of the target's gain over the start it reaches.
"""
from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

from rlft.files.handoff import read_manifest


def curve(metrics: Path) -> list[tuple[int, float]]:
    """(samples drawn, eval_greedy_accuracy) of each evaluation in one run, in order. An evaluation record off a
    logging step carries no samples_seen: its samples are interpolated between the logged records around it
    (linear in steps; past the last one, at its rate)."""
    records = [json.loads(line) for line in metrics.read_text().splitlines()]
    known = sorted({0: 0, **{int(r["step"]): int(r["samples_seen"]) for r in records
                             if "samples_seen" in r and "step" in r}}.items())
    points = []
    for record in records:
        if "eval_greedy_accuracy" in record:
            step = int(record.get("step", 0))
            samples = record.get("samples_seen")
            points.append((int(samples) if samples is not None else samples_at(known, step),
                           float(record["eval_greedy_accuracy"])))
    return points


def samples_at(known: list[tuple[int, int]], step: int) -> int:
    """Samples drawn by `step`, from the (step, samples) pairs logged (sorted, starting at (0, 0))."""
    below = max((k for k in known if k[0] <= step), default=known[0])
    above = next((k for k in known if k[0] > step), None)
    if above is None:  # past the last logged step: at the last rate
        rate = below[1] / below[0] if below[0] else 0.0
        return round(below[1] + rate * (step - below[0]))
    return round(below[1] + (above[1] - below[1]) * (step - below[0]) / (above[0] - below[0]))


def mean_curve(curves: list[list[tuple[int, float]]]) -> list[tuple[int, float, float]]:
    """(samples, mean, std) at each evaluation the seeds share (they evaluate at the same steps)."""
    length = min(len(c) for c in curves)
    out = []
    for i in range(length):
        accs = [c[i][1] for c in curves]
        out.append((round(statistics.mean(c[i][0] for c in curves)), statistics.mean(accs),
                    statistics.stdev(accs) if len(accs) > 1 else 0.0))
    return out


def samples_to_reach(points: list[tuple[int, float, float]], target: float) -> int | None:
    return next((s for s, acc, _ in points if acc >= target - 1e-9), None)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--run", required=True)
    p.add_argument("--root", default="runs")
    p.add_argument("--rows", default="grpo,distill,distill_outcome")
    p.add_argument("--seeds", default="0,1,2")
    p.add_argument("--reference", default="grpo", help="the row whose final accuracy the others are timed to")
    p.add_argument("--target", type=float, default=None,
                   help="an accuracy to time the rows to instead (e.g. the distillation teacher's held-out greedy "
                        "accuracy); the table also gives the share of its gain over the start each row reaches")
    args = p.parse_args()
    root = Path(args.root) / args.run
    rows = [r for r in args.rows.split(",") if r]
    curves = {}
    for row in rows:
        runs = [root / "table" / row / f"s{s}" / "metrics.jsonl" for s in args.seeds.split(",")]
        found = [curve(m) for m in runs if m.is_file() and read_manifest(m.parent) is not None]
        if found:
            curves[row] = (mean_curve(found), len(found))
    if args.reference not in curves:
        raise SystemExit(f"no finished run of the reference row {args.reference} under {root / 'table'}")
    ref_points = curves[args.reference][0]
    ref_samples = ref_points[-1][0]
    target = args.target if args.target is not None else ref_points[-1][1]
    what = f"the target {target:.3f}" if args.target is not None else f"{args.reference}'s final"
    start = ref_points[0][1]
    csv = ["row,seeds,samples,accuracy_mean,accuracy_std"]
    md = [f"Held-out greedy accuracy (mean ± std over seeds) against training samples; `{args.reference}` "
          f"ends at {ref_points[-1][1]:.3f} after {ref_samples:,} samples; start {start:.3f}, target {target:.3f}.",
          "", "| row | seeds | accuracy at each evaluation (samples: mean ± std) | final | best | share of the "
          f"target's gain (final, best) | samples to reach {what} | share of {args.reference}'s samples |",
          "|---|---|---|---|---|---|---|---|"]
    for row, (points, n) in curves.items():
        csv += [f"{row},{n},{s},{m:.4f},{sd:.4f}" for s, m, sd in points]
        reach = samples_to_reach(points, target)
        cells = ", ".join(f"{s:,}: {m:.3f} ± {sd:.3f}" for s, m, sd in points)
        share = f"{reach / ref_samples:.2f}" if reach is not None else "not reached"
        best = max(m for _, m, _ in points)
        gain = lambda acc: f"{(acc - start) / (target - start):.2f}" if target != start else "–"  # noqa: E731
        md.append(f"| {row} | {n} | {cells} | {points[-1][1]:.3f} | {best:.3f} | {gain(points[-1][1])}, "
                  f"{gain(best)} | {reach if reach is not None else '–'} | {share} |")
    (root / "sample_curves.csv").write_text("\n".join(csv) + "\n")
    (root / "sample_curves.md").write_text("\n".join(md) + "\n")
    plot(curves, root / "sample_curves.png")
    print("\n".join(md))
    print(f"wrote {root / 'sample_curves.md'}, .csv and .png")


def plot(curves: dict, path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    for row, (points, n) in curves.items():
        xs, ms, sds = zip(*points)
        ax.plot(xs, ms, marker="o", markersize=3, label=f"{row} ({n} seeds)")
        ax.fill_between(xs, [m - s for m, s in zip(ms, sds)], [m + s for m, s in zip(ms, sds)], alpha=0.15)
    ax.set_xlabel("training samples")
    ax.set_ylabel("held-out greedy accuracy")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


if __name__ == "__main__":
    main()
