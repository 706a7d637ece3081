#!/usr/bin/env python3
"""One table from the JSON files of a benchmark directory (scripts/bench_gpu.sh's $OUT), with
the performance goals checked against the fastest rlft run.

    python scripts/bench_summary.py bench_out            # prints Markdown; --out writes it too

Goals on a GPU (the default Qwen2-0.5B-shaped workload): step <= 1.0 s, peak memory <= 16 GiB,
generation >= 40k new tokens/s, update >= 130k tokens/s, and a step at least 6x faster than TRL's
fastest run. On a CPU: rlft's step at most 0.5x TRL's, side by side in the same report.
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

GOALS = [  # (label, key, better: "max" keeps values at most the bound, "min" at least)
    ("step (s)", "step_s", "max", 1.0),
    ("peak memory (GiB)", "peak_memory_gib", "max", 16.0),
    ("generation (new tok/s)", "generation_new_tokens_per_s", "min", 40_000.0),
    ("update (tok/s)", "update_tokens_per_s", "min", 130_000.0),
]
SPEEDUP_GOAL = 6.0  # GPU: TRL's fastest step / rlft's fastest step
CPU_RATIO_GOAL = 0.5  # CPU: rlft's step / TRL's step in the same report
RLFT_KEYS = ("engine", "cache", "kl_coef", "max_staleness", "micro_batch", "activation_checkpointing", "fused_loss",
             "logit_chunk_tokens")
TRL_KEYS = ("peer_cache", "peer_dtype", "kl_coef")


def load(directory: Path) -> list[tuple[str, dict]]:
    """(run name, report) for every bench_*.json in the directory, by name."""
    return [(p.stem.removeprefix("bench_"), json.loads(p.read_text())) for p in sorted(directory.glob("bench_*.json"))]


def describe(workload: dict, side: str) -> str:
    keys = RLFT_KEYS if side.startswith("rlft") else TRL_KEYS
    quiet = {"max_staleness": 0, "micro_batch": 0, "activation_checkpointing": False, "fused_loss": "rlft",
             "logit_chunk_tokens": None}  # said only where a run sets them
    return ", ".join(f"{k}={workload[k]}" for k in keys if k in workload and workload[k] != quiet.get(k, object()))


def rows(reports: list[tuple[str, dict]]) -> list[dict]:
    out = []
    for name, report in reports:
        for result in report["results"]:
            settings = describe(report["workload"], result["side"])
            if result.get("engine") and result["side"].startswith("rlft"):  # the engine rlft actually used
                settings += f"; engine: {result['engine']}"
            out.append({"run": name, "settings": settings,
                        "kl_coef": report["workload"].get("kl_coef", 0.0), **result})
            if "overlap" in result:  # asynchronous: the sampler's own time and the overlap
                out[-1]["settings"] += f"; sampler {fmt(result['sampler_busy_s'])} s a rollout, " \
                                       f"overlap {100 * result['overlap']:.0f}% of the step"
    return out


def fmt(value, digits: int = 3) -> str:
    if value is None:
        return ""
    return f"{value:,.0f}" if value >= 1000 else f"{value:.{digits}f}"


def verdict(met: bool) -> str:
    return "met" if met else "NOT met"


def summary(directory: Path) -> str:
    reports = load(directory)
    if not reports:
        raise SystemExit(f"bench_summary: no bench_*.json in {directory}; run scripts/bench_gpu.sh (or bench.py --out) first")
    table = rows(reports)
    lines = ["| run | side | step s | generation s | update s | gen new tok/s | update tok/s | peak GiB | settings |",
             "|---|---|---|---|---|---|---|---|---|"]
    for r in table:
        lines.append(f"| {r['run']} | {r['side']} | {fmt(r['step_s'])} | {fmt(r.get('generation_s'))} | "
                     f"{fmt(r.get('update_s'))} | {fmt(r.get('generation_new_tokens_per_s'))} | "
                     f"{fmt(r.get('update_tokens_per_s'))} | {fmt(r['peak_memory_gib'], 2)} | {r['settings']} |")
    shape = {k: v for k, v in reports[0][1]["workload"].items()
             if k in ("shape", "prompts", "samples", "prompt_tokens", "new_tokens", "precision")}
    lines += ["", f"workload: {json.dumps(shape)}"]
    ours = [r for r in table if r["side"].startswith("rlft") and r["kl_coef"] == 0]
    trl = [r for r in table if r["side"] == "trl"]
    if not ours:
        return "\n".join(lines)
    best = min(ours, key=lambda r: r["step_s"])
    if best["device"].startswith("cuda"):
        lines += ["", f"GPU goals, fastest rlft run at beta = 0 ({best['run']}: {best['settings']}):", ""]
        for label, key, kind, bound in GOALS:
            value = best.get(key)
            met = value is not None and (value <= bound if kind == "max" else value >= bound)
            sign = "<=" if kind == "max" else ">="
            lines.append(f"- {label}: {fmt(value)} (goal {sign} {fmt(bound)}): {verdict(met)}")
        if trl:
            fastest = min(trl, key=lambda r: r["step_s"])
            speedup = fastest["step_s"] / best["step_s"]
            lines.append(f"- TRL's fastest step / rlft's: {fastest['step_s']:.3f} / {best['step_s']:.3f} s = "
                         f"{speedup:.2f}x (goal >= {SPEEDUP_GOAL:.0f}x; TRL run {fastest['run']}): "
                         f"{verdict(speedup >= SPEEDUP_GOAL)}")
    else:
        lines += ["", f"CPU goal, rlft's step / TRL's in the same report (goal <= {CPU_RATIO_GOAL}):", ""]
        for name, report in reports:
            sides = {r["side"]: r for r in report["results"]}
            if "rlft" in sides and "trl" in sides:
                ratio = sides["rlft"]["step_s"] / sides["trl"]["step_s"]
                lines.append(f"- {name}: {sides['rlft']['step_s']:.3f} / {sides['trl']['step_s']:.3f} s = "
                             f"{ratio:.2f}: {verdict(ratio <= CPU_RATIO_GOAL)}")
    return "\n".join(lines)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("directory", type=Path)
    p.add_argument("--out", type=Path, default=None, help="also write the Markdown here")
    args = p.parse_args()
    text = summary(args.directory)
    print(text)
    if args.out:
        args.out.write_text(text + "\n")


if __name__ == "__main__":
    main()
