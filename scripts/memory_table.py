#!/usr/bin/env python3
"""What fits on a GPU: the memory arithmetic of rlft.memory (checked against measured peaks by
scripts/scale_check.sh) for Qwen2.5 0.5B, 1.5B and 7B, full fine-tuning and LoRA, ZeRO-2/3, optimizer
offload, on 1 and 8 GPUs, for SFT and for GRPO with colocated vLLM.

    python scripts/memory_table.py                       # H200 (139 GiB usable), bf16, the table in docs/performance.md
    python scripts/memory_table.py --gpu-gib 79 --tokens 2048 --micro 2

The workload: micro-batches of --micro sequences of --tokens positions, half of them response tokens
(logits), activation checkpointing on, bf16 with fp32 master weights and Adam. GRPO adds the reference
model (full fine-tuning; LoRA's reference is the adapter switched off) and vLLM's share of the GPU
(rollout.vllm.gpu_memory_utilization) while it generates; vLLM sleeps during the update, so the GRPO
peak is the states plus the larger of the vLLM share and the update's activations and logits or its
optimizer step (the step's temporaries: 3 x the fp32 gradient partition, as measured on CPU; a GPU's
foreach Adam makes fewer, so the full fine-tuning rows are on the safe side).
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from rlft import memory  # noqa: E402

GiB = 2**30
SETUPS = [  # (label, world, zero stage, offload, LoRA rank)
    ("full, ZeRO-2, 1 GPU", 1, 2, False, 0),
    ("full, ZeRO-3 + offload, 1 GPU", 1, 3, True, 0),
    ("full, ZeRO-2, 8 GPUs", 8, 2, False, 0),
    ("full, ZeRO-3, 8 GPUs", 8, 3, False, 0),
    ("LoRA r=64, ZeRO-0, 1 GPU", 1, 0, False, 64),
    ("QLoRA r=64 (NF4 base), ZeRO-0, 1 GPU", 1, 0, False, 64),
]


def rows(args) -> list[dict]:
    out = []
    for name in ("qwen2.5-0.5b", "qwen2.5-1.5b", "qwen2.5-7b"):
        shape = memory.SHAPES[name]
        for label, world, zero, offload, rank in SETUPS:
            common = dict(world=world, zero_stage=zero, precision="bf16", offload_optimizer=offload,
                          lora_rank=rank, load_in_4bit=label.startswith("QLoRA"), lora_targets=("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj",
                                                        "up_proj", "down_proj"),
                          activation_checkpointing=True, micro_batch_tokens=args.micro * args.tokens,
                          loss_tokens=args.micro * args.tokens // 2, runtime_bytes=int(args.runtime_gib * GiB))
            sft = memory.estimate(shape, memory.Setup(**common))
            grpo = memory.estimate(shape, memory.Setup(**common, reference=True))
            vllm = args.vllm_share * args.gpu_gib * GiB
            phases = {k: v for k, v in grpo.phases.items() if k != "generation"}  # vLLM generates, not hf
            grpo_peak = grpo.runtime + grpo.states + max(vllm, *phases.values())
            out.append(dict(model=name, setup=label, params_b=shape.params / 1e9, states_gib=grpo.states / GiB,
                            sft_gib=sft.peak / GiB, grpo_gib=grpo_peak / GiB))
    return out


def table(rs: list[dict], gpu_gib: float) -> str:
    ok = lambda x: "fits" if x <= gpu_gib else "**no**"  # noqa: E731
    lines = ["| model | setup | SFT peak (GiB/GPU) | GRPO states incl. reference (GiB/GPU) | GRPO peak (GiB/GPU) | "
             f"on {gpu_gib:.0f} GiB: SFT / GRPO |", "|---|---|---|---|---|---|"]
    for r in rs:
        lines.append(f"| {r['model']} ({r['params_b']:.2f}B) | {r['setup']} | {r['sft_gib']:.1f} | "
                     f"{r['states_gib']:.1f} | {r['grpo_gib']:.1f} | {ok(r['sft_gib'])} / {ok(r['grpo_gib'])} |")
    return "\n".join(lines)


def main(argv: list[str]) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--gpu-gib", type=float, default=139.0, help="usable memory per GPU (H200: about 139 GiB)")
    p.add_argument("--micro", type=int, default=4, help="sequences per micro-batch")
    p.add_argument("--tokens", type=int, default=1024, help="positions per sequence (prompt + response)")
    p.add_argument("--vllm-share", type=float, default=0.3, help="rollout.vllm.gpu_memory_utilization")
    p.add_argument("--runtime-gib", type=float, default=2.0,
                   help="CUDA context, communication buffers and allocator slack per GPU (an assumption)")
    args = p.parse_args(argv)
    print(table(rows(args), args.gpu_gib))


if __name__ == "__main__":
    main(sys.argv[1:])
