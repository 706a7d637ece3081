#!/usr/bin/env python3
"""A real model size on CPU: SFT and GRPO for 2 steps each on a model with Qwen2.5-0.5B's architecture
and vocabulary (random weights, a locally built tokenizer; scripts/scale_model.py), full fine-tuning
under ZeRO-3 on 2 ranks and LoRA on 1 rank, then each run's measured peak memory per rank beside the
arithmetic of rlft.memory.

    bash scripts/scale_check.sh                          # qwen2.5-0.5b shape, both setups (about 25 min, 2 cores)
    python scripts/scale_check.py --shape qwen2.5-vocab-small --setups lora     # seconds (the test)

Every run goes through `rlft train` like a user's: SFT on the built-in task (16 sequences per step,
4 per micro-batch and rank), then GRPO from that SFT model (4 prompts x 4 samples, 64 new tokens, the
preset's KL term, so a reference model), activation checkpointing on. The prediction counts the model
states, the largest phase (generation with ZeRO-3's gathered weights and the KV cache; training's
activations and logits; rank 0's export) and the process's own footprint: its peak resident memory
before the first model was loaded (interpreter, libraries, tokenized data), which every stage reports
(memory_before_model_gb_per_rank).

The ranks run with glibc's mmap threshold fixed at 1 MiB (MALLOC_MMAP_THRESHOLD_): freed tensors go back to
the system, so the resident peak measures live memory rather than the allocator's cache.

Writes <out>/scale_check.{md,json}: per run, the step time, measured and predicted peak per rank and
their ratio. Finished runs are not redone (delete <out>/runs to rerun).
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

from rlft.experiments import rlft_command
from rlft.files.handoff import read_manifest

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import scale_model  # noqa: E402

LIVE = 20_000_000  # ZeRO-3 live parameter elements: about one 0.5B layer (15M)
# glibc keeps freed blocks under 32 MiB for reuse (its mmap threshold rises to the largest block freed), so a
# CPU process's resident peak includes tensors long freed; a fixed 1 MiB threshold returns them to the system
# and the peak measures what is live (measured: ZeRO-3 SFT rank 0 10.19 GiB without, 8.20 with; step time equal)
MALLOC = {"MALLOC_MMAP_THRESHOLD_": str(2**20)}
SUB_GROUP = 50_000_000  # ZeRO-3 optimizer-step sub-group: 0.6 GiB of temporaries in fp32
SETUPS = {  # name -> (ranks, overrides of both stages)
    # gathered parameters released after use (DeepSpeed's default keeps a 0.5B model gathered whole) and the
    # optimizer step in sub-groups (its temporaries are 3 x a sub-group: 2.8 GiB per rank for the whole partition)
    "zero3": (2, ["deepspeed=zero3", "deepspeed.nproc_per_node=2", f"deepspeed.zero3_live_parameters={LIVE}",
                  f"deepspeed.zero3_sub_group_elements={SUB_GROUP}"]),
    "lora": (1, ["deepspeed=zero0", "model.lora.rank=16"]),
}
COMMON = ["model=hf", "deepspeed.activation_checkpointing=true", "train.save_every=0", "train.log_every=1",
          "train.warmup_steps=0", "train.max_steps=2", "train.micro_batch_per_device=4", "train.max_seq_len=256",
          "data.max_test_rows=8", "logger=none", "logger.progress=false"]
STAGES = {
    "sft": ["algo=sft", "train.batch_size=16"],
    "grpo": ["algo=grpo", "rollout.prompts_per_step=4", "rollout.samples_per_prompt=4", "rollout.max_new_tokens=64",
             "rollout.batch_size=16", "algo.eval_every=0"],
}


def train(run_root: Path, run: str, stage: str, overrides: list[str]) -> tuple[dict, float]:
    """Run one stage (unless its manifest exists); its summary and wall seconds."""
    stage_dir = run_root / run / stage
    timing = stage_dir / "wall_s.txt"
    if read_manifest(stage_dir) is None:
        finished = rlft_command(["train", *overrides, f"run.root={run_root}", f"run.name={run}"], tag="scale_check",
                                env=MALLOC)
        timing.write_text(f"{finished.seconds:.1f}")
    manifest = json.loads((stage_dir / "manifest.json").read_text())
    return manifest["summary"], float(timing.read_text()) if timing.is_file() else float("nan")


def lengths(model_dir: Path, stage: str) -> tuple[int, int]:
    """(padded length, first response column) bounds of this stage's micro-batches on the built-in task,
    from the data itself (2,000 training rows): the longest example (capped at train.max_seq_len) and the
    shortest prompt; GRPO's sequences are a prompt and max_new_tokens."""
    from hydra import compose, initialize_config_dir

    from rlft.config.schema import register_schemas
    from rlft.models import load_tokenizer
    from rlft.overrides import conf_dir
    from rlft.stages import inputs

    register_schemas()
    with initialize_config_dir(config_dir=str(conf_dir()), version_base=None):
        cfg = compose("config", overrides=[*COMMON, *STAGES[stage], f"model.path={model_dir}",
                                           "data.max_train_rows=2000"])
    tok = load_tokenizer(cfg.model, str(model_dir))
    examples = inputs.sft_examples(cfg, tok, "train")
    longest = max(len(ex["input_ids"]) for ex in examples)
    prompt = min(ex["loss_mask"].index(1) for ex in examples)
    if stage == "grpo":
        return prompt + int(cfg.rollout.max_new_tokens), prompt
    return longest, prompt


def predict(shape_name: str, setup: str, stage: str, runtime: int, model_dir: Path, rank0: bool = True):
    from rlft import memory

    ranks, _ = SETUPS[setup]
    shape = memory.SHAPES.get(shape_name) or memory.Shape(
        layers=(s := scale_model.SHAPES[shape_name])["num_hidden_layers"], hidden=s["hidden_size"],
        intermediate=s["intermediate_size"], heads=s["num_attention_heads"], kv_heads=s["num_key_value_heads"],
        vocab=s["vocab_size"], tied=s["tie_word_embeddings"])
    length, start = lengths(model_dir, stage)
    micro = 4
    gen = dict(generate_sequences=16, generate_positions=length) if stage == "grpo" else {}
    est = memory.estimate(shape, memory.Setup(
        world=ranks, zero_stage=3 if setup == "zero3" else 0, precision="fp32", zero3_live_parameters=LIVE,
        zero3_sub_group_elements=SUB_GROUP,
        lora_rank=16 if setup == "lora" else 0, reference=stage == "grpo", activation_checkpointing=True,
        micro_batch_tokens=micro * length, loss_tokens=micro * (length - start), runtime_bytes=runtime, **gen),
        cpu=True, rank0=rank0)
    return est


def step_time(summary: dict) -> float:
    """Seconds of the last optimizer step: RL's experience and update phases (time/step_s), else step_time_s."""
    if "time/step_s" in summary:
        return float(summary["time/step_s"])
    return float(summary["step_time_s"])


def table(rows: list[dict]) -> str:
    head = ("| run | stage | ranks | step time (s) | wall (s) | peak measured (GiB, per rank) | predicted (GiB, per rank) | "
            "measured / predicted | largest phase (rank 0) | before model (GiB) |")
    lines = [head, "|" + "---|" * 10]
    for r in rows:
        lines.append(f"| {r['setup']} | {r['stage']} | {r['ranks']} | {r['step_time_s']:.1f} | {r['wall_s']:.0f} | "
                     f"{' / '.join(f'{m:.2f}' for m in r['measured_gib'])} | "
                     f"{' / '.join(f'{p:.2f}' for p in r['predicted_gib'])} | "
                     + (f"{r['min_ratio']:.2f}–{r['ratio']:.2f}" if r['ranks'] > 1 else f"{r['ratio']:.2f}")
                     + f" | {r['phase']} | {r['runtime_gib']:.2f} |")
    return "\n".join(lines)


def main(argv: list[str]) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--shape", choices=sorted(scale_model.SHAPES), default="qwen2.5-0.5b")
    p.add_argument("--out", type=Path, default=Path("runs/scale"))
    p.add_argument("--setups", default="zero3,lora", help="comma-separated: " + ",".join(SETUPS))
    p.add_argument("--stages", default="sft,grpo")
    args = p.parse_args(argv)
    out = args.out.resolve()
    # built in its own process: a run started from this one inherits its peak resident set (Linux keeps
    # ru_maxrss across fork and exec), and building a 0.5B model here would count as that run's own
    model_dir = out / f"{args.shape}-shape"
    subprocess.run([sys.executable, scale_model.__file__, "--shape", args.shape, "--out", str(model_dir)], check=True,
                   stdout=subprocess.DEVNULL)
    params = json.loads((model_dir / "shape.json").read_text())["parameters"]
    print(f"[scale_check] {args.shape}: {params / 1e6:.1f}M parameters at {model_dir}", flush=True)
    rows = []
    for setup in args.setups.split(","):
        ranks, extra = SETUPS[setup]
        for stage in args.stages.split(","):
            parent = [f"model.path={model_dir}"] if stage == "sft" else [f"model.path={out}/runs/{setup}/sft/final"]
            summary, wall = train(out / "runs", setup, stage, [*STAGES[stage], *COMMON, *extra, *parent])
            measured = [float(x) for x in summary["peak_memory_gb_per_rank"]]  # GiB
            before = summary["memory_before_model_gb_per_rank"]
            ests = [predict(args.shape, setup, stage, int(b * 2**30), model_dir, rank0=r == 0)
                    for r, b in enumerate(before)]
            predicted = [e.peak / 2**30 for e in ests]
            est = ests[0]
            rows.append(dict(setup=setup, stage=stage, ranks=ranks, step_time_s=step_time(summary),
                             wall_s=wall, measured_gib=measured, predicted_gib=predicted,
                             ratio=max(m / p for m, p in zip(measured, predicted)),
                             min_ratio=min(m / p for m, p in zip(measured, predicted)), phase=est.peak_phase,
                             predicted_parts_gib={k: v / 2**30 for k, v in {**est.parts, **est.phases}.items()},
                             runtime_gib=max(before), parameters=params, shape=args.shape))
    md = table(rows)
    print(md)
    (out / "scale_check.md").write_text(md + "\n")
    (out / "scale_check.json").write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main(sys.argv[1:])
