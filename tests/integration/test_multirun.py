"""`rlft train -m` runs one job per combination, each into its own directory.

    rlft train -m algo=sft run.name=sweep train.lr=1e-3,2e-3 train.max_steps=2 ...
      -> runs/sweep/multirun/<timestamp>/0/sft/   (train.lr=0.001)
         runs/sweep/multirun/<timestamp>/1/sft/   (train.lr=0.002)

Both jobs run in one driver process (one process group, reused), so the second job must not
inherit the first one's state: its first-step loss equals the first job's (same seed, same data,
untouched initial weights), and its final weights equal, bit for bit, those of the same job run
on its own.
"""
from __future__ import annotations

import pytest
import torch
from omegaconf import OmegaConf

from helpers import TINY, check_ok, load_safetensors, read_manifest, run_cli, tmp_leftovers, train_records


ARGS = ["train.max_steps=2", *TINY, "train.batch_size=8", "train.micro_batch_per_device=4", "train.log_every=1",
        "train.warmup_steps=0"]


def test_sweep_jobs_get_distinct_directories(tmp_path):
    proc = check_ok(run_cli(tmp_path, "train", "-m", "algo=sft", "run.name=sweep", "train.lr=1e-3,2e-3", *ARGS))
    sweeps = list((tmp_path / "runs" / "sweep" / "multirun").iterdir())
    assert len(sweeps) == 1, sweeps
    jobs = sorted(p.name for p in sweeps[0].iterdir() if p.is_dir())
    assert jobs == ["0", "1"], jobs
    assert not (tmp_path / "runs" / "sweep" / "sft").exists(), "a sweep job wrote to the single-run directory"

    lrs, first_losses, weights = [], [], []
    for job in jobs:
        run = sweeps[0] / job / "sft"
        assert (run / "final" / "model.safetensors").is_file()
        assert read_manifest(run)["completed"] is True
        assert not tmp_leftovers(run)
        cfg = OmegaConf.load(run / "config.yaml")
        assert cfg.run.dir == str(run.relative_to(tmp_path)) or cfg.run.dir == str(run)
        lrs.append(cfg.train.lr)
        records = train_records(run)
        assert [r["step"] for r in records] == [1, 2]
        first_losses.append(records[0]["loss"])
        weights.append(load_safetensors(run / "final"))
    assert lrs == [1e-3, 2e-3]
    assert first_losses[0] == pytest.approx(first_losses[1], rel=1e-6)
    assert any(not torch.equal(weights[0][k], weights[1][k]) for k in weights[0])
    assert proc.stdout.count("wrote ") >= 2

    check_ok(run_cli(tmp_path, "train", "algo=sft", "run.name=solo", "train.lr=2e-3", *ARGS))
    solo = load_safetensors(tmp_path / "runs" / "solo" / "sft" / "final")
    assert all(torch.equal(solo[k], weights[1][k]) for k in solo), "the second sweep job differs from a solo run"


def _summary(tmp_path, name):
    sweeps = list((tmp_path / "runs" / name / "multirun").iterdir())
    assert len(sweeps) == 1, sweeps
    return sweeps[0], (sweeps[0] / "summary.csv").read_text().splitlines(), (sweeps[0] / "summary.md").read_text()


def test_a_four_job_sweep_writes_its_summary_table(tmp_path):
    check_ok(run_cli(tmp_path, "train", "-m", "algo=sft", "run.name=grid", "train.lr=1e-3,2e-3", "seed=1,2", *ARGS))
    sweep, rows, md = _summary(tmp_path, "grid")
    header = rows[0].split(",")
    assert header[:4] == ["job", "status", "train.lr", "seed"]
    assert "eval_loss" in header and "loss" in header
    assert len(rows) == 5
    jobs = {}
    for line in rows[1:]:
        cells = dict(zip(header, line.split(",")))
        assert cells["status"] == "completed"
        jobs[(cells["train.lr"], cells["seed"])] = cells
        manifest = read_manifest(sweep / cells["job"] / "sft")
        assert float(cells["eval_loss"]) == pytest.approx(manifest["summary"]["eval_loss"], rel=1e-3)
    assert set(jobs) == {("0.001", "1"), ("0.001", "2"), ("0.002", "1"), ("0.002", "2")}
    assert md.startswith("Shared overrides: algo=sft run.name=grid") and md.count("| completed |") == 4


def test_optuna_sweeper_searches_and_gets_the_objective(tmp_path):
    proc = check_ok(run_cli(tmp_path, "train", "-m", "hydra/sweeper=optuna", "hydra.sweeper.n_trials=2",
                            "hydra.sweeper.direction=minimize", "train.lr=interval(1e-4,1e-2)", "algo=sft",
                            "run.name=search", *ARGS))
    sweep, rows, _ = _summary(tmp_path, "search")
    assert len(rows) == 3
    results = OmegaConf.load(sweep / "optimization_results.yaml")
    losses = [float(line.split(",")[rows[0].split(",").index("eval_loss")]) for line in rows[1:]]
    assert results.best_value == pytest.approx(min(losses), rel=1e-3)  # the job returned run.objective=eval_loss
    assert "sweep summary (2 jobs)" in proc.stdout
