"""scripts/pipeline.sh: SFT -> RM -> GRPO -> eval under one run name, interrupted during RL and
run again: the finished stages are skipped (their manifests untouched), GRPO resumes from its
newest checkpoint and completes, and the comparison table has both models."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

from helpers import REPO, RL_SMALL, TINY, cli_env, read_manifest

SCRIPT = REPO / "scripts" / "pipeline.sh"
RL_STEPS = 30


def pipeline_env() -> dict:
    return cli_env(
        PATH=os.pathsep.join([os.path.dirname(sys.executable), os.environ.get("PATH", "")]),
        SFT_ARGS="train.max_steps=3 train.batch_size=8 train.micro_batch_per_device=8",
        RM_ARGS="train.max_steps=2 train.batch_size=8 train.micro_batch_per_device=8",
        RL_ARGS=" ".join([*RL_SMALL, f"train.max_steps={RL_STEPS}", "train.save_every=2", "algo.eval_every=0"]),
        EVAL_ARGS="eval.num_problems=4 eval.samples=2 eval.k=[1,2] eval.max_new_tokens=12 eval.policy_samples=2")


def test_interrupted_pipeline_resumes_without_redoing_finished_stages(tmp_path):
    cmd = ["bash", str(SCRIPT), "grpo", "pipe", *TINY]
    first = subprocess.Popen(cmd, cwd=tmp_path, env=pipeline_env(), stdout=subprocess.PIPE,
                             stderr=subprocess.STDOUT, text=True, start_new_session=True)
    run = tmp_path / "runs" / "pipe"
    deadline = time.time() + 400
    while not list((run / "grpo" / "checkpoints").glob("step-*")):
        assert first.poll() is None, f"the pipeline ended before the interruption:\n{first.stdout.read()[-3000:]}"
        assert time.time() < deadline, "no GRPO checkpoint in time"
        time.sleep(0.1)
    os.killpg(first.pid, signal.SIGKILL)
    first.wait()
    killed_at = sorted(int(p.name.split("-")[1]) for p in (run / "grpo" / "checkpoints").glob("step-*"))[-1]
    assert killed_at < RL_STEPS
    assert read_manifest(run / "sft")["completed"] and read_manifest(run / "rm")["completed"]
    assert not (run / "grpo" / "manifest.json").exists()
    stamps = {s: (run / s / "manifest.json").stat().st_mtime_ns for s in ("sft", "rm")}

    second = subprocess.run(cmd, cwd=tmp_path, env=pipeline_env(), capture_output=True, text=True, timeout=600)
    out = second.stdout + second.stderr
    assert second.returncode == 0, out[-4000:]
    assert "[pipeline] sft: complete, skipped" in out and "[pipeline] rm: complete, skipped" in out
    assert "[pipeline] grpo: interrupted, resuming" in out and f"at step {killed_at}" in out
    assert {s: (run / s / "manifest.json").stat().st_mtime_ns for s in ("sft", "rm")} == stamps
    assert read_manifest(run / "grpo")["completed"] is True
    steps = [json.loads(line)["step"] for line in (run / "grpo" / "metrics.jsonl").read_text().splitlines()
             if "reward" in json.loads(line)]
    assert steps[-1] == RL_STEPS and min(steps) >= 1
    table = (run / "eval" / "comparison.md").read_text()
    assert "| sft |" in table and "| grpo |" in table

    third = subprocess.run(cmd, cwd=tmp_path, env=pipeline_env(), capture_output=True, text=True, timeout=600)
    assert third.returncode == 0 and "[pipeline] grpo: complete, skipped" in third.stdout


def test_unknown_rl_algorithm_is_refused_before_any_training(tmp_path):
    proc = subprocess.run(["bash", str(SCRIPT), "ppx", "pipe"], cwd=tmp_path, env=pipeline_env(),
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "unknown RL algorithm 'ppx'" in lines[0] and "ppo" in lines[0]
    assert not (tmp_path / "runs").exists()
