"""One table of every model evaluated in a run: runs/<name>/eval/comparison.{md,csv}; and what the experiment
scripts' tables share: the mean ± std over seeds (seed_table) and the problem-by-problem counts of held-out
problems fixed and broken against a starting model, with a one-sided sign test (paired_cell).

    python -m rlft.eval.compare runs/demo [sft grpo ppo ...]    # optional row order
"""
from __future__ import annotations

import csv
import io
import json
import math
import sys
from pathlib import Path

# the columns shown, when present (maj@K and pass@K at the largest K), then the reward sources;
# the rest stay in eval.json
LEADING = ["greedy_accuracy", "maj@K", "pass@K", "pass@1", "reward", "rm_score", "kl_to_ref",
           "kl_to_ref_per_token", "mean_response_tokens", "truncation_rate"]


def load_records(eval_root: Path) -> dict[str, dict]:
    """{tag: eval.json record} for every evaluated model under eval_root."""
    return {p.parent.name: json.loads(p.read_text()) for p in sorted(Path(eval_root).glob("*/eval.json"))}


def columns(records: dict[str, dict]) -> list[str]:
    present = set().union(*(r["metrics"] for r in records.values())) if records else set()
    sources = sorted(k for k in present if k.startswith("reward/"))
    ks = [int(k.split("@")[1]) for k in present if k.startswith("pass@")]
    top = [c.replace("@K", f"@{max(ks)}") for c in LEADING] if ks else LEADING
    return list(dict.fromkeys(c for c in top if c in present)) + sources


def table_rows(records: dict[str, dict], order: list[str] | None = None) -> tuple[list[str], list[list[str]]]:
    names = [n for n in (order or []) if n in records] + sorted(n for n in records if n not in (order or []))
    cols = columns(records)
    rows = []
    for name in names:
        m = records[name]["metrics"]
        rows.append([name] + [f"{m[c]:.3f}" if isinstance(m.get(c), float) else str(m.get(c, "")) for c in cols])
    return ["model"] + cols, rows


def markdown(header: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    return "\n".join(lines + ["| " + " | ".join(r) + " |" for r in rows])


def write_table(stem: Path, header: list[str], rows: list[list[str]]) -> str:
    """Write <stem>.md and <stem>.csv; returns the markdown table."""
    stem = Path(stem)
    table = markdown(header, rows)
    stem.parent.mkdir(parents=True, exist_ok=True)
    stem.with_suffix(".md").write_text(table + "\n")
    buf = io.StringIO()
    csv.writer(buf).writerows([header] + rows)
    stem.with_suffix(".csv").write_text(buf.getvalue())
    return table


def write_comparison(eval_root: Path, order: list[str] | None = None) -> str:
    """Write comparison.md and comparison.csv under eval_root; returns the markdown table."""
    eval_root = Path(eval_root)
    return write_table(eval_root / "comparison", *table_rows(load_records(eval_root), order))


def main(argv: list[str]) -> None:
    if not argv:
        raise SystemExit("usage: python -m rlft.eval.compare runs/<name> [model ...]")
    run = Path(argv[0])
    root = run / "eval" if (run / "eval").is_dir() else run
    print(write_comparison(root, argv[1:]))


if __name__ == "__main__":
    main(sys.argv[1:])


# ----------------------------------------------------------------------------- several seeds
SEED_COLUMNS = ["greedy_accuracy", "maj@K", "pass@K", "reward", "kl_to_ref"]


def mean_std(values: list[float]) -> tuple[float, float]:
    """Mean and sample standard deviation (0 for a single value)."""
    n = len(values)
    mean = sum(values) / n
    var = sum((v - mean) ** 2 for v in values) / (n - 1) if n > 1 else 0.0
    return mean, var ** 0.5


def seed_table(records: dict[str, dict], samples_seen: dict[str, float], rows: list[str], seeds: list[int],
               baseline: str, gain_goal: float = 0.05,
               paired: dict[str, str] | None = None) -> tuple[list[str], list[list[str]]]:
    """One line per row name: mean ± std over seeds of the eval metrics of `<row>-s<seed>` records, the
    greedy-accuracy gain over the baseline's record (`baseline`, evaluated once), whether the mean gain
    reaches gain_goal, the training samples each seed's run saw (`samples_seen[<row>-s<seed>]`) and, given
    `paired` ({row: paired_cell(...)}), the problems fixed / broken against the baseline."""
    base = records[baseline]["metrics"]
    ks = [int(k.split("@")[1]) for k in base if k.startswith("pass@")]
    cols = [c.replace("@K", f"@{max(ks)}") for c in SEED_COLUMNS] if ks else SEED_COLUMNS
    header = ["model", "seeds", *cols, "gain (greedy)", f"≥ +{gain_goal * 100:g} pts", "samples seen"]
    header += [f"fixed / broken vs {baseline}"] if paired is not None else []
    lines = [[baseline, "–", *(f"{base[c]:.3f}" for c in cols), "", "", ""] + ([""] if paired is not None else [])]
    for row in rows:
        tags = [f"{row}-s{s}" for s in seeds if f"{row}-s{s}" in records]
        if not tags:
            continue
        cells = []
        for c in cols:
            mean, std = mean_std([records[t]["metrics"][c] for t in tags])
            cells.append(f"{mean:.3f} ± {std:.3f}")
        gain, gain_std = mean_std([records[t]["metrics"]["greedy_accuracy"] - base["greedy_accuracy"] for t in tags])
        seen = sorted({int(samples_seen[t]) for t in tags if t in samples_seen})
        lines.append([row, str(len(tags)), *cells, f"{round(gain * 100, 1) + 0.0:+.1f} ± {gain_std * 100:.1f} pts",
                      "yes" if gain >= gain_goal else "no", "/".join(f"{s:,}" for s in seen)]
                     + ([paired.get(row, "")] if paired is not None else []))
    return header, lines


# ----------------------------------------------------------------------------- problem by problem
def greedy_right(eval_dir: Path) -> list[tuple[str, bool]] | None:
    """(prompt, whether the greedy answer was right) per problem of one evaluation (its samples.jsonl), in
    its order; None when the evaluation kept no samples."""
    path = Path(eval_dir) / "samples.jsonl"
    if not path.is_file():
        return None
    return [(r["prompt"], bool(r["greedy"]["correct"])) for r in map(json.loads, path.read_text().splitlines())]


def fixed_broken(before: list[tuple[str, bool]], after: list[tuple[str, bool]]) -> tuple[int, int]:
    """Problems right after and wrong before (fixed), and wrong after and right before (broken); both
    evaluations pose the same problems in the same order (a repeated problem counts each time)."""
    if [p for p, _ in before] != [p for p, _ in after]:
        raise ValueError("the two evaluations did not pose the same problems in the same order")
    return (sum(a and not b for (_, b), (_, a) in zip(before, after)),
            sum(b and not a for (_, b), (_, a) in zip(before, after)))


def sign_test_p(fixed: int, broken: int) -> float:
    """One-sided sign test on the changed problems: P(at least `fixed` of them fixed | no effect)."""
    n = fixed + broken
    return sum(math.comb(n, k) for k in range(fixed, n + 1)) / 2 ** n if n else 1.0


def paired_cell(pairs: list[tuple[Path, Path]]) -> str:
    """`fixed / broken (p = …)` summed over (before, after) evaluation folders, e.g. each seed's starting
    model and its RL model; pairs missing samples are skipped, "" when none is left."""
    fixed = broken = counted = 0
    for before_dir, after_dir in pairs:
        before, after = greedy_right(before_dir), greedy_right(after_dir)
        if before is not None and after is not None:
            f, b = fixed_broken(before, after)
            fixed, broken, counted = fixed + f, broken + b, counted + 1
    return f"{fixed} / {broken} (p = {sign_test_p(fixed, broken):.2g})" if counted else ""
