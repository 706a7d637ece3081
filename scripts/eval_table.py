#!/usr/bin/env python3
"""Markdown table of every model evaluated in a run (also written to runs/<name>/eval/comparison.md).

    python scripts/eval_table.py runs/demo [sft grpo ...]     # optional order of rows
"""
import sys

from rlft.eval.compare import main

if __name__ == "__main__":
    main(sys.argv[1:])
