"""`rlft plot runs/<name>`: training curves from every stage's metrics.jsonl, as PNG files.

    rlft plot runs/demo                 # -> runs/demo/plots/<stage>.png and compare_<metric>.png
    rlft plot runs/demo/grpo --out figs # one stage directory, PNGs into figs/

Per stage, one figure with a panel per family of metrics that the stage logged: reward (total
and per source), KL to the reference, accuracy (held-out greedy accuracy, token or pair
accuracy), response length, losses. Across stages, compare_<metric>.png overlays the stages
that logged the same metric (reward, kl, eval_greedy_accuracy, response_len), e.g. GRPO, PPO
and P3O of one run.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

PANELS = {  # panel title -> (predicate on the metric name)
    "reward": lambda k: k == "reward" or k.startswith("reward/"),
    "KL to reference (nats/token)": lambda k: k == "kl",
    "accuracy": lambda k: k.endswith(("_acc", "accuracy")),  # greedy, token, pair, step, solution, reward
    "response length (tokens)": lambda k: k == "response_len",
    "loss": lambda k: k in ("loss", "eval_loss", "value_loss", "dpo_loss", "policy_loss"),
}
COMPARE = ["reward", "kl", "eval_greedy_accuracy", "response_len"]


class PlotError(ValueError):
    pass


def read_series(path: Path) -> dict[str, list[tuple[int, float]]]:
    """{metric: [(step, value), ...]} from a metrics.jsonl (numeric values only)."""
    series: dict[str, list[tuple[int, float]]] = {}
    for line in path.read_text().splitlines():
        if not line.strip():
            continue
        record = json.loads(line)
        step = record.get("step")
        if not isinstance(step, (int, float)):
            continue
        for key, value in record.items():
            if key != "step" and isinstance(value, (int, float)) and not isinstance(value, bool):
                series.setdefault(key, []).append((int(step), float(value)))
    return series


def find_stages(target: Path) -> dict[str, Path]:
    """{stage label: metrics.jsonl} under a run directory (or the stage directory itself)."""
    if (target / "metrics.jsonl").is_file():
        return {target.name: target / "metrics.jsonl"}
    found = {}
    for path in sorted(target.rglob("metrics.jsonl")):
        rel = path.parent.relative_to(target)
        if "checkpoints" in rel.parts or "wandb" in rel.parts:
            continue
        found[str(rel).replace("/", "_")] = path
    return found


def stage_panels(series: dict) -> list[tuple[str, list[str]]]:
    """(panel title, metric names) of the panels a stage's figure gets: every family it logged."""
    panels = [(title, sorted(k for k in series if pick(k))) for title, pick in PANELS.items()]
    return [(t, keys) for t, keys in panels if keys]


def plot_stage(name: str, series: dict, out: Path) -> Path | None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = stage_panels(series)
    if not panels:
        return None
    fig, axes = plt.subplots(1, len(panels), figsize=(4.2 * len(panels), 3.4), squeeze=False)
    for ax, (title, keys) in zip(axes[0], panels):
        for key in keys:
            steps, values = zip(*series[key])
            ax.plot(steps, values, marker="o" if len(steps) < 15 else None, markersize=3, label=key)
        ax.set_title(title, fontsize=10)
        ax.set_xlabel("step")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    fig.suptitle(name)
    fig.tight_layout()
    path = out / f"{name}.png"
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def plot_compare(metric: str, stages: dict[str, dict], out: Path) -> Path | None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    having = {name: s[metric] for name, s in stages.items() if metric in s}
    if len(having) < 2:
        print(f"[rlft] no compare_{metric}.png: " + (f"only {next(iter(having))} logged it" if having
                                                      else "no stage logged it"))
        return None
    fig, ax = plt.subplots(figsize=(6, 4))
    for name, points in having.items():
        steps, values = zip(*points)
        ax.plot(steps, values, marker="o" if len(steps) < 15 else None, markersize=3, label=name)
    ax.set_xlabel("step")
    ax.set_ylabel(metric)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    path = out / f"compare_{metric}.png"
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def plot_run(target: Path, out: Path | None = None) -> list[Path]:
    target = Path(target)
    if not target.is_dir():
        raise PlotError(f"{target} is not a directory; give a run (runs/<name>) or a stage directory")
    stages = find_stages(target)
    if not stages:
        raise PlotError(f"no metrics.jsonl under {target}; train a stage first (rlft train ... run.name=<name>)")
    out = Path(out) if out else target / "plots"
    out.mkdir(parents=True, exist_ok=True)
    series = {name: read_series(path) for name, path in stages.items()}
    written = [plot_stage(name, s, out) for name, s in series.items()]
    written += [plot_compare(metric, series, out) for metric in COMPARE]
    return [p for p in written if p is not None]


def main(args: list[str]) -> None:
    if not args or args[0] in ("-h", "--help"):
        print(__doc__.strip().splitlines()[0] + "\n\nusage: rlft plot RUN_OR_STAGE_DIR [--out DIR]")
        return
    out = None
    if "--out" in args:
        i = args.index("--out")
        if i + 1 >= len(args):
            raise PlotError("--out needs a directory")
        out = Path(args[i + 1])
        args = args[:i] + args[i + 2:]
    if len(args) != 1:
        raise PlotError("give one run or stage directory, e.g. rlft plot runs/demo")
    for path in plot_run(Path(args[0]), out):
        print(f"wrote {path}")


if __name__ == "__main__":
    main(sys.argv[1:])
