"""Offline DPO: runs end to end from an SFT checkpoint; at the first step the policy equals the
reference, so every pair's margin is 0 and the loss is exactly log 2."""
import math

import torch
from transformers import AutoModelForCausalLM

from helpers import (SMALL_BATCH, TINY, assert_finite, check_ok, load_safetensors, read_manifest, run_cli, stage_dir,
                     train_records)


def test_dpo_from_sft(tmp_path):
    check_ok(run_cli(tmp_path, "train", "algo=sft", "run.name=d", "train.max_steps=3", *TINY, *SMALL_BATCH))
    check_ok(run_cli(tmp_path, "train", "algo=dpo", "run.name=d", "train.max_steps=3", "algo.num_eval_pairs=10",
                     *TINY, *SMALL_BATCH))
    out = stage_dir(tmp_path, "d", "dpo")
    records = train_records(out / "metrics.jsonl")
    assert abs(records[0]["loss"] - math.log(2)) < 1e-5, records[0]
    assert abs(records[0]["margin"]) < 1e-6
    assert_finite([r["loss"] for r in records])
    assert read_manifest(out)["stage"] == "dpo"
    sft = load_safetensors(stage_dir(tmp_path, "d", "sft") / "final" / "model.safetensors")
    dpo = load_safetensors(out / "final" / "model.safetensors")
    assert any(not torch.equal(sft[k], dpo[k]) for k in sft)
    AutoModelForCausalLM.from_pretrained(out / "final")
