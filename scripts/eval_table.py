#!/usr/bin/env python3
"""Markdown table of every eval.json under runs/<name>/eval/ (one row per evaluated model).

    python scripts/eval_table.py runs/demo [sft grpo ...]     # optional order of rows
"""
import json
import sys
from pathlib import Path

COLUMNS = ["greedy_accuracy", "maj@8", "pass@8", "pass@1", "mean_response_tokens", "truncation_rate"]


def main(argv: list[str]) -> None:
    run = Path(argv[0])
    order = argv[1:]
    records = {p.parent.name: json.loads(p.read_text()) for p in sorted((run / "eval").glob("*/eval.json"))}
    names = [n for n in order if n in records] + [n for n in records if n not in order]
    print("| model | " + " | ".join(COLUMNS) + " |")
    print("|---|" + "---|" * len(COLUMNS))
    for name in names:
        m = records[name]["metrics"]
        cells = [f"{m[c]:.3f}" if isinstance(m.get(c), float) else str(m.get(c, "")) for c in COLUMNS]
        print(f"| {name} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main(sys.argv[1:])
