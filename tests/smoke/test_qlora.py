"""QLoRA (model.lora.load_in_4bit): the trained model's base in 4 bits (NF4, bitsandbytes on CPU), the
adapter trained over it. final/ is a plain transformers model equal to the dequantized base plus the
merged adapter, a resume ends with the uninterrupted run's weights, and RL's reference is the 4-bit base
with the adapter off."""
from __future__ import annotations

import json

import pytest
import torch

from helpers import RL_SMALL, USER_REWARD, check_ok, load_safetensors, read_metrics, rl_cli, stage_dir
from test_lora import load_adapter

pytest.importorskip("bitsandbytes", reason="QLoRA needs bitsandbytes (installed by .[test])")

RUN = "ql"
QLORA = ["model.lora.rank=4", "model.lora.alpha=8", "model.lora.load_in_4bit=true"]
SMALL = ["train.batch_size=8", "train.micro_batch_per_device=8", "train.log_every=1", "train.save_every=0",
         "train.lr=1e-2", "train.lr_schedule=constant", "train.warmup_steps=0"]


def dequantized_parent(parent_dir) -> dict:
    """The parent's weights as QLoRA's base holds them: loaded in 4 bits by transformers, dequantized."""
    from transformers import AutoModelForCausalLM

    from rlft import lora

    model = AutoModelForCausalLM.from_pretrained(parent_dir,
                                                 quantization_config=lora.quantization_config(torch.float32),
                                                 device_map={"": "cpu"})
    return lora.dequantized_state_dict(model, model.state_dict())


def merged(base: dict, adapter_dir) -> dict:
    config = json.loads((adapter_dir / "adapter_config.json").read_text())
    adapter, out = load_adapter(adapter_dir), dict(base)
    for key in adapter:
        if ".lora_A." in key:
            module = key[len("base_model.model."):].split(".lora_A.")[0]
            delta = adapter[key.replace(".lora_A.", ".lora_B.")] @ adapter[key]
            out[f"{module}.weight"] = base[f"{module}.weight"] + config["lora_alpha"] / config["r"] * delta
    return out


def test_qlora_sft_resume_and_grpo(tmp_path):
    from transformers import AutoModelForCausalLM

    check_ok(rl_cli(tmp_path, "train", "algo=sft", f"run.name={RUN}", "train.max_steps=3", *SMALL))  # full SFT
    sft = stage_dir(tmp_path, RUN, "sft") / "final"
    args = ["train", "algo=sft", f"run.name={RUN}", f"model.path={sft}", *SMALL, *QLORA]
    check_ok(rl_cli(tmp_path, *args, "train.max_steps=4", "run.dir=runs/ql/full"))
    # 3 steps (a checkpoint at step 2, the adapter only), then resumed from that checkpoint to 4
    check_ok(rl_cli(tmp_path, *args, "train.max_steps=3", "train.save_every=2", "run.dir=runs/ql/parts"))
    out = check_ok(rl_cli(tmp_path, *args, "train.max_steps=4", "train.save_every=2", "run.dir=runs/ql/parts",
                          "resume=true")).stdout
    assert "resumed from" in out and "step-0000002" in out, out[-2000:]
    full_dir = tmp_path / "runs" / "ql" / "full"
    full, parts = (load_safetensors(tmp_path / "runs" / "ql" / d / "final") for d in ("full", "parts"))
    assert full.keys() == parts.keys() and all(torch.equal(full[k], parts[k]) for k in full)

    # final/ = the 4-bit base, dequantized, + the adapter; the fp32 parent + the adapter is not it
    parent, base = load_safetensors(sft), dequantized_parent(sft)
    expected = merged(base, full_dir / "final-adapter")
    assert not any("lora" in k or "absmax" in k for k in full)
    for key, value in full.items():
        torch.testing.assert_close(value, expected[key], rtol=1e-5, atol=1e-6, msg=key)
    q_proj = "model.layers.0.self_attn.q_proj.weight"
    assert (base[q_proj] - parent[q_proj]).abs().max() > 1e-3  # the base really was 4 bits
    assert (full[q_proj] - merged(parent, full_dir / "final-adapter")[q_proj]).abs().max() > 1e-3
    plain = AutoModelForCausalLM.from_pretrained(full_dir / "final")  # no quantization_config in its config
    assert getattr(plain.config, "quantization_config", None) is None
    assert torch.isfinite(plain(input_ids=torch.randint(3, 40, (2, 9))).logits).all()

    # GRPO: the reference is the 4-bit base with the adapter off (KL 0 before the first update)
    check_ok(rl_cli(tmp_path, "train", "algo=grpo", f"run.name={RUN}", *RL_SMALL, "train.max_steps=2",
                    "train.lr=1e-2", f"reward.functions=[{USER_REWARD}:alternate]", *QLORA))
    records = [r for r in read_metrics(stage_dir(tmp_path, RUN, "grpo")) if "kl" in r]
    assert records[0]["kl"] < 1e-12 < records[1]["kl"]
    grpo = load_safetensors(stage_dir(tmp_path, RUN, "grpo") / "final")
    assert (grpo[q_proj] - base[q_proj]).abs().max() > 0  # the adapter moved, merged over the 4-bit base


def test_qlora_reward_models_and_dpo(tmp_path):
    """RM and PRM train the adapter over the 4-bit base plus their full-precision head; DPO's reference
    log-probs come from the 4-bit base before the adapter exists."""
    check_ok(rl_cli(tmp_path, "train", "algo=sft", f"run.name={RUN}", "train.max_steps=2", *SMALL))
    for algo in ("rm", "prm", "dpo"):
        check_ok(rl_cli(tmp_path, "train", f"algo={algo}", f"run.name={RUN}", "train.max_steps=2", *SMALL, *QLORA))
        final = stage_dir(tmp_path, RUN, algo) / "final"
        weights = load_safetensors(final)
        assert not any("lora" in k or "absmax" in k or "quant" in k for k in weights), algo
        assert "quantization_config" not in json.loads((final / "config.json").read_text())
        if algo != "dpo":
            assert weights["score.weight"].dtype == torch.float32 and weights["score.weight"].abs().sum() > 0


def test_qlora_refuses_zero3_and_the_built_in_model(tmp_path):
    from helpers import one_line_error

    proc = rl_cli(tmp_path, "train", "algo=sft", f"run.name={RUN}", "train.max_steps=1", *QLORA, "deepspeed=zero3")
    assert proc.returncode != 0 and "cannot be sharded by ZeRO-3" in one_line_error(proc)
    proc = rl_cli(tmp_path, "train", "algo=sft", f"run.name={RUN}", "train.max_steps=1", *QLORA)
    assert proc.returncode != 0 and "start from a checkpoint" in one_line_error(proc)
