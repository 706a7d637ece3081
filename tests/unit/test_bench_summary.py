"""scripts/bench_summary.py: the table and the goal checks, on hand-written benchmark reports."""
from __future__ import annotations

import importlib.util
import json

import pytest
from helpers import REPO

spec = importlib.util.spec_from_file_location("bench_summary", REPO / "scripts" / "bench_summary.py")
bench_summary = importlib.util.module_from_spec(spec)
spec.loader.exec_module(bench_summary)

WORKLOAD = {"shape": "qwen2-0.5b", "prompts": 8, "samples": 8, "prompt_tokens": 128, "new_tokens": 256,
            "precision": "bf16", "kl_coef": 0.0, "cache": "static", "engine": "vllm"}


def rlft(device, step, gen_tps, upd_tps, mem):
    return {"side": "rlft", "device": device, "step_s": step, "generation_s": step / 2, "update_s": step / 2,
            "generation_new_tokens_per_s": gen_tps, "update_tokens_per_s": upd_tps, "peak_memory_gib": mem}


def write(tmp_path, name, workload, *results):
    (tmp_path / f"bench_{name}.json").write_text(json.dumps({"workload": workload, "results": list(results)}))


def test_gpu_goals_are_checked_on_the_fastest_rlft_run(tmp_path):
    write(tmp_path, "rlft_vllm", WORKLOAD, rlft("cuda:0", 0.9, 45_000.0, 140_000.0, 12.0))
    write(tmp_path, "trl_static", dict(WORKLOAD, peer_cache="static", peer_dtype="bfloat16"),
          rlft("cuda:0", 1.4, 30_000.0, 120_000.0, 20.0),
          {"side": "trl", "device": "cuda:0", "step_s": 6.1, "peak_memory_gib": 45.0})
    write(tmp_path, "rlft_kl", dict(WORKLOAD, kl_coef=0.04), rlft("cuda:0", 0.5, 90_000.0, 300_000.0, 10.0))
    text = bench_summary.summary(tmp_path)
    assert "fastest rlft run at beta = 0 (rlft_vllm" in text  # the beta > 0 run is not a candidate
    lines = {line.split(":")[0]: line for line in text.splitlines() if line.startswith("- ")}
    for label, value in (("step (s)", "0.900"), ("peak memory (GiB)", "12.000"),
                         ("generation (new tok/s)", "45,000"), ("update (tok/s)", "140,000")):
        assert lines[f"- {label}"].startswith(f"- {label}: {value} (goal") and lines[f"- {label}"].endswith(": met")
    speed = lines["- TRL's fastest step / rlft's"]
    assert "6.100 / 0.900 s = 6.78x" in speed and speed.endswith("): met")


def test_cpu_reports_check_the_side_by_side_ratio(tmp_path):
    cpu = dict(WORKLOAD, shape="tiny", precision="fp32")
    write(tmp_path, "trl_default", cpu, rlft("cpu", 0.52, 27_000.0, 56_000.0, 0.8),
          {"side": "trl", "device": "cpu", "step_s": 0.80, "peak_memory_gib": 0.9})
    text = bench_summary.summary(tmp_path)
    assert "- trl_default: 0.520 / 0.800 s = 0.65: NOT met" in text
    assert "GPU goals" not in text


def test_the_paths_rlft_took_are_shown_when_reported(tmp_path):
    ran = dict(rlft("cuda:0", 0.9, 45_000.0, 140_000.0, 12.0),
               engine="vllm (colocated, GPU, sleep mode, prefix caching); auto: GPU with vllm installed")
    write(tmp_path, "rlft_default", dict(WORKLOAD, engine="auto"), ran)
    row = next(line for line in bench_summary.summary(tmp_path).splitlines() if line.startswith("| rlft_default"))
    assert row.endswith("engine=auto, cache=static, kl_coef=0.0; engine: vllm (colocated, GPU, sleep mode, prefix "
                        "caching); auto: GPU with vllm installed |")


def test_an_empty_directory_is_a_clear_error(tmp_path):
    with pytest.raises(SystemExit, match="no bench_\\*.json in"):
        bench_summary.summary(tmp_path)
