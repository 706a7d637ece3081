#!/usr/bin/env python3
"""Per-call cost of env=python's sandbox: the median wall time of one code run in each mode, rounds alternated.

    python scripts/bench_sandbox.py                       # bwrap and trusted, 40 rounds
    python scripts/bench_sandbox.py --against old.py      # and another sandbox module's run(code, Limits())

`--against` takes a file with the same `run(code, limits)` and `Limits` (e.g. an earlier rlft's sandbox, from
`git show <commit>:rlft/envs/sandbox.py > old.py`). The code run is a typical tool call (an arithmetic print).
Writes one JSON line per configuration to --out (default: stdout only).
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from rlft.envs import sandbox  # noqa: E402

CODE = "print(17 * 23)\nprint(sum(i * i for i in range(1000)))\n"


def load(path: str):
    spec = importlib.util.spec_from_file_location("sandbox_against", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def runners(against: str | None) -> dict:
    out = {mode: (lambda mode=mode: sandbox.run(CODE, sandbox.Limits(), mode)) for mode in sandbox.MODES}
    if against:
        other = load(against)
        out[f"against:{Path(against).name}"] = lambda: other.run(CODE, other.Limits())
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=40)
    parser.add_argument("--against", help="another sandbox module to time beside this one")
    parser.add_argument("--out", help="append the results here as JSON lines")
    args = parser.parse_args()
    todo = runners(args.against)
    for name, call in todo.items():  # warm up: the isolation probe, the page cache
        result = call()
        assert result.error is None and result.output.startswith("391"), (name, result)
    times = {name: [] for name in todo}
    for _ in range(args.rounds):
        for name, call in todo.items():
            tic = time.perf_counter()
            call()
            times[name].append((time.perf_counter() - tic) * 1000)
    for name, ms in times.items():
        row = {"sandbox": name, "median_ms": round(statistics.median(ms), 1),
               "p90_ms": round(sorted(ms)[int(0.9 * len(ms))], 1), "rounds": len(ms)}
        if name in sandbox.MODES:
            row["isolation"] = sandbox.describe(name)
        print(json.dumps(row), flush=True)
        if args.out:
            with open(args.out, "a") as f:
                f.write(json.dumps(row) + "\n")


if __name__ == "__main__":
    main()
