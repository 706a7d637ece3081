"""scripts/bench.py on a very small workload: both sides run, the JSON carries every phase, the
lengths are fixed (EOS suppressed), and the ratio is computed from the measured step times of
alternating rounds."""
from __future__ import annotations

import json
import subprocess
import sys

from helpers import REPO, cli_env


def test_bench_runs_the_vllm_engine_with_fixed_lengths(tmp_path):
    from helpers import require
    from rlft.rollout.generate import vllm_available

    require(vllm_available())  # make test installs vllm
    out = tmp_path / "bench.json"
    cmd = [sys.executable, str(REPO / "scripts" / "bench.py"), "--device=cpu", "--threads=1", "--prompts=2",
           "--samples=2", "--prompt-tokens=8", "--new-tokens=6", "--steps=1", "--warmup=1", "--engine=vllm",
           "--shape=tiny", f"--out={out}"]
    proc = subprocess.run(cmd, cwd=tmp_path, env=cli_env(), capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    (rlft,) = json.loads(out.read_text())["results"]
    assert rlft["engine"].startswith("vllm (colocated, CPU") and rlft["new_tokens"] == 2 * 2 * 6


def test_bench_runs_rlft_and_trl_on_the_same_workload(tmp_path):
    out = tmp_path / "bench.json"
    cmd = [sys.executable, str(REPO / "scripts" / "bench.py"), "--device=cpu", "--threads=1", "--prompts=2",
           "--samples=2", "--prompt-tokens=8", "--new-tokens=6", "--steps=2", "--warmup=1", "--peer=trl",
           "--rounds", "2", f"--out={out}"]
    proc = subprocess.run(cmd, cwd=tmp_path, env=cli_env(), capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads(out.read_text())
    assert report["workload"]["shape"] == "tiny" and report["workload"]["new_tokens"] == 6
    rlft, trl = report["results"]
    assert rlft["side"] == "rlft" and trl["side"] == "trl"
    assert rlft["new_tokens"] == 2 * 2 * 6  # every completion exactly --new-tokens long
    for key in ("generation_s", "scoring_s", "update_s", "step_s", "peak_memory_gib"):
        assert rlft[key] > 0, key
    assert rlft["engine"].startswith("hf (transformers generate") and "auto: CPU" in rlft["engine"]  # CPU default
    assert rlft["steps_measured"] == 2 and trl["steps_measured"] == 2 and trl["step_s"] > 0
    # two rounds, alternating sides: each side's step is the median of its rounds, the ratio the
    # median of the rounds' ratios
    assert len(rlft["step_s_rounds"]) == 2 and len(trl["step_s_rounds"]) == 2
    assert rlft["step_s"] == sum(rlft["step_s_rounds"]) / 2
    per_round = [t / r for r, t in zip(rlft["step_s_rounds"], trl["step_s_rounds"])]
    assert report["ratios"]["trl_step_over_rlft_step_rounds"] == per_round
    assert abs(report["ratios"]["trl_step_over_rlft_step"] - sum(per_round) / 2) < 1e-12
    assert "| rlft |" in proc.stdout and "| trl |" in proc.stdout


def test_bench_times_the_asynchronous_step_with_its_sampler_and_overlap(tmp_path):
    out = tmp_path / "bench.json"
    cmd = [sys.executable, str(REPO / "scripts" / "bench.py"), "--device=cpu", "--threads=1", "--prompts=2",
           "--samples=2", "--prompt-tokens=8", "--new-tokens=6", "--steps=2", "--warmup=1", "--max-staleness=1",
           f"--out={out}"]
    proc = subprocess.run(cmd, cwd=tmp_path, env=cli_env(), capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads(out.read_text())
    (rlft,) = report["results"]
    assert report["workload"]["max_staleness"] == 1 and rlft["side"] == "rlft async K=1"
    assert rlft["new_tokens"] == 2 * 2 * 6 and rlft["sampler_busy_s"] > 0 and 0 <= rlft["overlap"] <= 1
    assert "a sampler process beside the trainer" in rlft["sampler"] and "on CPU, 1 thread(s)" in rlft["sampler"]
