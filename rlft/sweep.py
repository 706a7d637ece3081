"""Sweep summaries: after every job of `rlft train -m …`, one table of overrides -> final metrics.

Hydra calls SweepSummary (registered in conf/config.yaml under hydra.callbacks) in the driver
process; it rewrites <sweep dir>/summary.csv and summary.md after each job, so an interrupted
sweep keeps the rows of its finished jobs. A job's metrics are the `summary` of its stage
manifest (the last logged training metrics and the final evaluation); a job that failed shows
its status and no metrics.

The objective a search sweeper optimises (Hydra's Optuna sweeper: hydra/sweeper=optuna) is
`run.objective`, read from the same summary and returned by the job.
"""
from __future__ import annotations

import csv
import io
from pathlib import Path

from hydra.experimental.callback import Callback

from rlft.files import handoff

# summary keys worth a column when present, in this order; the rest follow alphabetically
LEADING = ["eval_greedy_accuracy", "eval_loss", "eval_pair_accuracy", "reward", "kl", "loss", "response_len"]


def objective_value(summary: dict, objective: str) -> float | None:
    """run.objective from a stage summary (auto: held-out accuracy, else eval loss, else loss)."""
    keys = ["eval_greedy_accuracy", "eval_pair_accuracy", "eval_step_accuracy", "eval_loss", "loss"] \
        if objective == "auto" else [objective]
    for key in keys:
        if isinstance(summary.get(key), (int, float)):
            return float(summary[key])
    return None


def summary_columns(rows: list[dict]) -> list[str]:
    present = set().union(*(r["metrics"] for r in rows)) if rows else set()
    rest = sorted(k for k in present if k not in LEADING and not k.startswith("time_"))
    return [k for k in LEADING if k in present] + rest


def render(rows: list[dict]) -> tuple[str, str]:
    """(csv text, markdown table) with one row per job; the overrides that vary between jobs get a
    column each, the ones all jobs share are listed once above the markdown table."""
    all_keys = list(dict.fromkeys(k for r in rows for k in r["overrides"]))
    varying = [k for k in all_keys if len({r["overrides"].get(k) for r in rows}) > 1]
    override_keys = varying if len(rows) > 1 else all_keys
    shared = {k: rows[0]["overrides"].get(k) for k in all_keys if k not in override_keys}
    metric_keys = summary_columns(rows)
    header = ["job", "status", *override_keys, *metric_keys]
    table = []
    for r in rows:
        cells = [str(r["job"]), r["status"], *(r["overrides"].get(k, "") for k in override_keys)]
        for k in metric_keys:
            v = r["metrics"].get(k, "")
            cells.append(f"{v:.4g}" if isinstance(v, float) else str(v))
        table.append(cells)
    buf = io.StringIO()
    csv.writer(buf).writerows([header] + table)
    md = [f"Shared overrides: {' '.join(f'{k}={v}' for k, v in shared.items())}", ""] if shared else []
    md += ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    md += ["| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |" for cells in table]
    return buf.getvalue(), "\n".join(md) + "\n"


def job_row(config, job_return) -> dict:
    """One job's overrides, status and final metrics (from its stage manifest)."""
    from rlft.launch import job_dir

    overrides = dict(o.split("=", 1) for o in (job_return.overrides or []) if "=" in o)
    overrides = {k: v for k, v in overrides.items() if not k.startswith("hydra")}
    manifest = handoff.read_manifest(job_dir(config)) or {}
    status = job_return.status.name.lower() if job_return.status is not None else "unknown"
    if status == "completed" and not manifest.get("completed"):
        status = "incomplete"
    return {"job": config.hydra.job.num, "status": status, "overrides": overrides,
            "metrics": dict(manifest.get("summary") or {}), "dir": str(job_dir(config))}


class SweepSummary(Callback):
    def __init__(self) -> None:
        self.rows: list[dict] = []

    def on_multirun_start(self, config, **kwargs) -> None:
        self.rows = []

    def on_job_end(self, config, job_return, **kwargs) -> None:
        from hydra.core.hydra_config import HydraConfig
        from hydra.types import RunMode

        try:
            if HydraConfig.get().mode != RunMode.MULTIRUN:
                return
        except ValueError:
            return
        try:
            row = job_row(config, job_return)
        except Exception as exc:  # a summary must never turn a finished job into a failure
            print(f"[rlft] sweep summary: could not read job {config.hydra.job.num}: {exc}", flush=True)
            return
        self.rows = [r for r in self.rows if r["job"] != row["job"]] + [row]
        self.write(Path(config.hydra.sweep.dir))

    def write(self, sweep_dir: Path) -> None:
        text_csv, text_md = render(sorted(self.rows, key=lambda r: r["job"]))
        sweep_dir.mkdir(parents=True, exist_ok=True)
        for name, text in (("summary.csv", text_csv), ("summary.md", text_md)):
            tmp = sweep_dir / f".tmp-{name}"
            tmp.write_text(text)
            tmp.replace(sweep_dir / name)

    def on_multirun_end(self, config, **kwargs) -> None:
        if self.rows:
            sweep_dir = Path(config.hydra.sweep.dir)
            print(f"[rlft] sweep summary ({len(self.rows)} jobs): {sweep_dir / 'summary.md'}", flush=True)
            print(render(sorted(self.rows, key=lambda r: r["job"]))[1], flush=True)
