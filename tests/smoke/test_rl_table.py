"""scripts/rl_table.py on the tiny model: the SFT parent (and only the reward models the rows read), three
rows at one equal sample budget, their evaluations, the table; a second invocation trains and evaluates nothing.
The rows are rewarded by a user function that scores every other completion 1 (the random-init policy never
answers correctly, and offline RFT needs samples to keep). The distill rows' commands take --teacher."""
from __future__ import annotations

import csv
import json
import re
import subprocess
import sys

from helpers import REPO, TINY, USER_REWARD, rl_env

BUDGET = 32
ARGS = ["--run", "tb", "--rows", "grpo,dpo,rft", "--seeds", "0", "--budget", str(BUDGET), "--eval-problems", "4",
        "--parent-arg", "train.max_steps=2", "--parent-arg", "train.batch_size=8",
        "--parent-arg", "train.micro_batch_per_device=8", "--reward-data", "data",
        "--rl-arg", "rollout.prompts_per_step=2", "--rl-arg", "train.micro_batch_per_device=4",
        "--rl-arg", "dpo,rft:train.batch_size=4", "--rl-arg", f"reward.functions=[{USER_REWARD}:alternate]",
        "--rl-arg", "rollout.max_new_tokens=64",  # offline RFT keeps finished samples only
        "--", *TINY, "rollout.max_new_tokens=12", "eval.max_new_tokens=12", "eval.samples=2", "eval.k=[1,2]",
        "eval.policy_samples=2"]


def run(tmp_path, *extra):
    return subprocess.run([sys.executable, str(REPO / "scripts" / "rl_table.py"), *ARGS[:-len(TINY) - 6], *extra,
                           *ARGS[-len(TINY) - 6:]],
                          cwd=tmp_path, env=rl_env(), capture_output=True, text=True, timeout=900)


def test_every_row_sees_the_same_number_of_samples(tmp_path):
    proc = run(tmp_path)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    root = tmp_path / "runs" / "tb"
    lines = list(csv.DictReader(open(root / "rl_table.csv")))
    assert [line["model"] for line in lines] == ["sft", "grpo", "dpo", "rft"]
    # GRPO: 2 rollouts of 2 prompts x 8 samples; DPO: 4 steps of 4 pairs; RFT: 8 steps of 4 sequences
    assert [line["samples seen"] for line in lines[1:]] == [str(BUDGET)] * 3
    for row in ("grpo", "dpo", "rft"):
        manifest = json.loads((root / "table" / row / "s0" / "manifest.json").read_text())
        assert manifest["summary"]["samples_seen"] == BUDGET
        assert (root / "eval" / f"{row}-s0" / "eval.json").is_file()
    rft = json.loads((root / "table" / "rft" / "s0" / "manifest.json").read_text())["summary"]
    assert rft["rft_sampled"] == BUDGET  # offline RFT samples the budget once from the SFT model
    assert "± 0.000" in (root / "rl_table.md").read_text()
    # problem by problem against the SFT model: fixed - broken is the change in greedy accuracy
    sft = json.loads((root / "eval" / "sft" / "eval.json").read_text())["metrics"]["greedy_accuracy"]
    problems = len((root / "eval" / "sft" / "samples.jsonl").read_text().splitlines())
    for line in lines[1:]:
        fixed, broken = map(int, re.match(r"(\d+) / (\d+) \(p = ", line["fixed / broken vs sft"]).groups())
        acc = json.loads((root / "eval" / f"{line['model']}-s0" / "eval.json").read_text())["metrics"]
        assert fixed - broken == round((acc["greedy_accuracy"] - sft) * problems)

    again = run(tmp_path)
    assert again.returncode == 0, again.stderr[-2000:]
    assert "rlft train" not in again.stdout and "rlft eval" not in again.stdout
    # another budget in the same run is refused rather than mixed with the finished runs
    other = subprocess.run([sys.executable, str(REPO / "scripts" / "rl_table.py"),
                            *[("64" if a == str(BUDGET) else a) for a in ARGS]],
                           cwd=tmp_path, env=rl_env(), capture_output=True, text=True, timeout=300)
    assert other.returncode != 0 and "train.max_samples=32, not --budget 64" in other.stderr, other.stderr[-2000:]

    # maj@K / pass@K curves of the SFT model and the table's GRPO seeds (scripts/passk_curve.py)
    curve = subprocess.run([sys.executable, str(REPO / "scripts" / "passk_curve.py"), "--run", "tb", "--rows", "grpo",
                            "--kmax", "4", "--eval-problems", "4", "--", *TINY, "eval.max_new_tokens=12"],
                           cwd=tmp_path, env=rl_env(), capture_output=True, text=True, timeout=600)
    assert curve.returncode == 0, curve.stdout[-2000:] + curve.stderr[-3000:]
    points = list(csv.DictReader(open(root / "passk" / "passk.csv")))
    assert [(p["model"], p["k"]) for p in points] == [(m, k) for m in ("sft", "grpo") for k in ("1", "2", "4")]
    for m in ("sft", "grpo"):
        passes = [float(p["pass"]) for p in points if p["model"] == m]
        assert passes == sorted(passes)  # pass@K never falls with K
    assert (root / "passk" / "passk.png").stat().st_size > 1000


def test_distill_rows_take_the_teacher_and_no_reward_model_is_trained_for_them(tmp_path):
    script = [sys.executable, str(REPO / "scripts" / "rl_table.py"), "--dry-run", "--seeds", "0"]
    plan = subprocess.run([*script, "--rows", "grpo,distill,distill_outcome", "--teacher", "builtin:tiny"],
                          cwd=tmp_path, env=rl_env(), capture_output=True, text=True, timeout=120)
    assert plan.returncode == 0, plan.stderr[-2000:]
    lines = plan.stdout.splitlines()
    trains = [line for line in lines if line.startswith("rlft train")]
    assert [line.split()[2] for line in trains] == ["algo=sft", "algo=grpo", "algo=distill", "algo=distill"]
    assert all("teacher.path=builtin:tiny" in line for line in trains[2:])
    assert "algo.outcome_weight=1.0" in trains[3] and "teacher.path" not in trains[1]
    ppo = subprocess.run([*script, "--rows", "ppo"], cwd=tmp_path, env=rl_env(), capture_output=True, text=True,
                         timeout=120)
    assert "rlft train algo=rm" in ppo.stdout and "algo=prm" not in ppo.stdout  # the critic starts from the RM
    refused = subprocess.run([*script, "--rows", "distill"], cwd=tmp_path, env=rl_env(), capture_output=True,
                             text=True, timeout=120)
    assert refused.returncode != 0 and "--teacher" in refused.stderr.strip().splitlines()[-1]
