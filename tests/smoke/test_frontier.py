"""scripts/frontier.py on the tiny model: a beta sweep per algorithm and seed (Hydra multirun) at an
equal sample budget, an evaluation per run against the SFT model, the CSV and the PNG; a second invocation trains and evaluates nothing."""
from __future__ import annotations

import csv
import subprocess
import sys

from helpers import REPO, TINY, cli_env

ARGS = ["--run", "fr", "--algos", "grpo,p3o_separate", "--betas", "grpo=0.5", "--betas", "p3o_separate=0.05", "--budget", "16", "--seeds", "0,1",
        "--eval-problems", "4", "--policy-samples", "2",
        "--parent-arg", "train.max_steps=3", "--parent-arg", "train.batch_size=8",
        "--parent-arg", "train.micro_batch_per_device=8",
        "--rl-arg", "rollout.prompts_per_step=2", "--rl-arg", "rollout.samples_per_prompt=4",
        "--rl-arg", "rollout.max_new_tokens=12", "--rl-arg", "train.micro_batch_per_device=4",
        "--rl-arg", "algo.minibatches_per_rollout=1", "--rl-arg", "algo.updates_per_rollout=1",
        "--rl-arg", "algo.eval_every=0", "--rl-arg", "algo.eval_problems=4", "--rl-arg", "rollout.batch_size=8",
        "--", *TINY]


def run(tmp_path):
    return subprocess.run([sys.executable, str(REPO / "scripts" / "frontier.py"), *ARGS], cwd=tmp_path,
                          env=cli_env(), capture_output=True, text=True, timeout=900)


def test_frontier_sweeps_beta_evaluates_and_plots(tmp_path):
    import matplotlib.image as mpimg

    proc = run(tmp_path)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    out = tmp_path / "runs" / "fr" / "frontier"
    rows = list(csv.DictReader(open(out / "frontier.csv")))
    assert sorted((r["algo"], r["beta"], r["seed"]) for r in rows) == [
        ("grpo", "0.5", "0"), ("grpo", "0.5", "1"), ("p3o_separate", "0.05", "0"), ("p3o_separate", "0.05", "1"), ("sft", "", "")]
    for r in rows[1:]:
        # equal samples: 2 rollouts of 2 prompts x 4 completions, whatever the algorithm
        assert r["samples_seen"] == "16"
        assert float(r["kl_to_ref"]) == float(r["kl_to_ref"])  # a number (not NaN)
        assert 0.0 <= float(r["reward"]) <= 1.0
        assert (tmp_path / r["dir"] / "manifest.json").is_file() and "/frontier/" in r["dir"]
        if r["algo"] == "p3o_separate":  # a variant: the p3o preset with its pair loss
            assert "pairwise_loss: p3o_separate" in (tmp_path / r["dir"] / "config.yaml").read_text()
    assert mpimg.imread(out / "frontier.png").shape[0] > 100
    # each beta ran as a job of one multirun per algorithm, which wrote its sweep summary
    assert (out / "grpo" / "sweep0" / "summary.md").is_file() and (out / "grpo" / "sweep1" / "summary.md").is_file()
    assert "| grpo | 0.5 | 2 |" in proc.stdout  # the table of means over the two seeds

    again = run(tmp_path)
    assert again.returncode == 0
    assert "rlft train" not in again.stdout and "rlft eval" not in again.stdout
