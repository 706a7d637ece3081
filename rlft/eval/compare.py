"""One table of every model evaluated in a run: runs/<name>/eval/comparison.{md,csv}.

    python -m rlft.eval.compare runs/demo [sft grpo ppo ...]    # optional row order
"""
from __future__ import annotations

import csv
import io
import json
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


def write_comparison(eval_root: Path, order: list[str] | None = None) -> str:
    """Write comparison.md and comparison.csv under eval_root; returns the markdown table."""
    eval_root = Path(eval_root)
    header, rows = table_rows(load_records(eval_root), order)
    table = markdown(header, rows)
    eval_root.mkdir(parents=True, exist_ok=True)
    (eval_root / "comparison.md").write_text(table + "\n")
    buf = io.StringIO()
    csv.writer(buf).writerows([header] + rows)
    (eval_root / "comparison.csv").write_text(buf.getvalue())
    return table


def main(argv: list[str]) -> None:
    if not argv:
        raise SystemExit("usage: python -m rlft.eval.compare runs/<name> [model ...]")
    run = Path(argv[0])
    root = run / "eval" if (run / "eval").is_dir() else run
    print(write_comparison(root, argv[1:]))


if __name__ == "__main__":
    main(sys.argv[1:])
