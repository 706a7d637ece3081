"""Batched sampling with a KV cache: n completions per prompt, cut at the first EOS.

Completions of one prompt are contiguous (prompt i's samples are rows i*n .. i*n+n-1), the
layout the group-normalised advantages expect. A completion keeps its first EOS (an action the
policy took) and nothing after it; one that reaches max_new_tokens without EOS is truncated.

Speed (engine.generation_*): rows are generated in batches of similar prompt length (prompt
bucketing: less left padding). Each batch then runs either the lean sampler (rlft/rollout/lean.py:
Llama-family models, the prompt prefilled once per distinct prompt, a preallocated cache, no
per-step framework overhead; the default on CPU, where its step is a compiled kernel,
rlft/rollout/native.py) or Hugging Face's `generate`, padded to a
multiple of `pad_multiple` tokens so that only a few shapes occur, with a static KV cache whose
decoding step Hugging Face compiles on a GPU (torch.compile + CUDA graphs), or the dynamic cache.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from rlft.data.encode import collate_padded
from rlft.rollout import native
from rlft.rollout.lean import lean_generate, native_unsupported, unsupported


@dataclass
class SamplingConfig:
    max_new_tokens: int = 128
    do_sample: bool = True
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    batch_size: int = 64
    cache: str = "static"  # static | dynamic KV cache
    compile: bool = True  # GPU: compile HF's static-cache decoding step; the lean sampler's step as a CUDA graph
    bucket: bool = True  # batch rows of similar prompt length together
    pad_multiple: int = 16  # left-pad each batch's prompts to a multiple of this many tokens (Hugging Face path)
    impl: str = "auto"  # lean | hf | auto (lean where the model allows it, on CPU)
    kernel: str = "auto"  # lean sampler's CPU step: native (compiled kernel) | torch | auto (native where it builds)


GENERATION_CACHES = ("static", "dynamic")
GENERATION_IMPLS = ("auto", "lean", "hf")
GENERATION_KERNELS = ("auto", "native", "torch")
DISTRIBUTION_NEUTRAL = dict(repetition_penalty=1.0, no_repeat_ngram_size=0, encoder_repetition_penalty=1.0,
                            min_new_tokens=None, min_length=0, bad_words_ids=None, sequence_bias=None)


def generation_options(engine_cfg) -> dict:
    """SamplingConfig's speed fields from the engine config (engine.generation_*)."""
    return dict(cache=engine_cfg.generation_cache, compile=engine_cfg.generation_compile,
                bucket=engine_cfg.generation_bucket, pad_multiple=engine_cfg.generation_pad_multiple,
                impl=engine_cfg.generation_impl, kernel=engine_cfg.generation_kernel)


def use_lean(model, sampling: SamplingConfig, device: torch.device, total_len: int) -> bool:
    """Whether this batch takes the lean sampler: always with impl=lean (an error when the model
    cannot), never with hf; auto takes it on CPU for the models it supports. (On a GPU, auto keeps
    Hugging Face's compiled static-cache path.)"""
    if sampling.impl == "hf":
        return False
    reason = unsupported(model, total_len)
    if sampling.impl == "lean":
        if reason:
            raise ValueError(f"engine.generation_impl=lean cannot sample from this model: {reason}; "
                             "use engine.generation_impl=hf (or auto)")
        return True
    return reason is None and device.type == "cpu"


def native_kernel(model, sampling: SamplingConfig, device: torch.device):
    """The compiled CPU decoding kernel for the lean sampler (rlft/rollout/native.py), or None for its
    PyTorch step: kernel=torch never; auto where the model, device and machine allow it; native
    always (an error naming the reason when it cannot)."""
    if sampling.kernel == "torch":
        return None
    reason = native_unsupported(model, device) or native.unavailable_reason()
    if reason:
        if sampling.kernel == "native":
            raise ValueError(f"engine.generation_kernel=native cannot decode here: {reason}; "
                             "use engine.generation_kernel=torch (or auto)")
        return None
    return native.kernel()


def describe_sampler(model, sampling: SamplingConfig, device: torch.device) -> str:
    """One line on which sampler runs, and why (for the run's console header)."""
    total = sampling.max_new_tokens + 1
    if use_lean(model, sampling, device, total):
        if device.type == "cuda":
            return "lean (rlft's decoding loop" + (" with CUDA-graph decoding)" if sampling.compile else ")")
        if native_kernel(model, sampling, device) is not None:
            return "lean (rlft's decoding loop, compiled CPU kernel)"
        why = ("engine.generation_kernel=torch" if sampling.kernel == "torch" else
               f"kernel unavailable: {native_unsupported(model, device) or native.unavailable_reason()}")
        return f"lean (rlft's decoding loop, PyTorch step; {why})"
    reason = unsupported(model, total)
    why = f"; lean unsupported: {reason}" if reason else f" (engine.generation_impl={sampling.impl})"
    return f"Hugging Face generate, {sampling.cache} cache{why}"


@dataclass
class Generations:
    prompt_index: list[int]          # which prompt each completion answers
    completion_ids: list[list[int]]  # up to and including the first EOS
    texts: list[str]                 # decoded completion, EOS and padding removed
    truncated: list[bool]            # no EOS within max_new_tokens


def cut_at_eos(tokens: list[int], eos_id: int, pad_id: int) -> tuple[list[int], bool]:
    """(tokens up to and including the first EOS, truncated?)"""
    if eos_id in tokens:
        return tokens[:tokens.index(eos_id) + 1], False
    while tokens and tokens[-1] == pad_id and pad_id != eos_id:
        tokens = tokens[:-1]
    return tokens, True


@torch.no_grad()
def generate(model, tokenizer, prompt_ids: list[list[int]], samples_per_prompt: int, sampling: SamplingConfig,
             device: torch.device | None = None) -> Generations:
    """Sample `samples_per_prompt` completions for every prompt, `sampling.batch_size` rows at a time."""
    device = device or next(model.parameters()).device
    eos, pad = tokenizer.eos_token_id, tokenizer.pad_token_id
    rows = [(i, ids) for i, ids in enumerate(prompt_ids) for _ in range(samples_per_prompt)]
    order = generation_order([len(ids) for _, ids in rows], sampling.bucket)
    results: list[tuple[list[int], bool] | None] = [None] * len(rows)
    was_training = model.training
    model.eval()
    for start in range(0, len(rows), sampling.batch_size):
        chunk = order[start:start + sampling.batch_size]
        ids, attn = collate_padded([rows[k][1] for k in chunk], pad, side="left")
        if use_lean(model, sampling, device, ids.shape[1] + sampling.max_new_tokens):
            new = lean_generate(model, ids.to(device), attn.to(device), sampling.max_new_tokens, sampling.do_sample,
                                sampling.temperature, sampling.top_k, sampling.top_p, eos, pad,
                                cuda_graph=sampling.compile, native=native_kernel(model, sampling, device))
            for k, row in zip(chunk, new.tolist()):
                results[k] = cut_at_eos(row, eos, pad)
            continue
        ids, attn = left_pad_to_multiple(ids, attn, pad, sampling.pad_multiple)
        # the checkpoint's own sampling extras that reshape the distribution (a chat model's
        # repetition penalty, n-gram blocking) are switched off: samples come from the policy's
        # distribution at the configured temperature / top-k / top-p, the one its log-probs describe
        kwargs = dict(max_new_tokens=sampling.max_new_tokens, do_sample=sampling.do_sample,
                      pad_token_id=pad, eos_token_id=eos, use_cache=True, **DISTRIBUTION_NEUTRAL)
        if sampling.cache == "static":
            kwargs.update(cache_implementation="static", disable_compile=not sampling.compile)
        if sampling.do_sample:
            # top_k=0 switches top-k off explicitly (None would fall back to the model's default of 50)
            kwargs.update(temperature=sampling.temperature, top_p=sampling.top_p, top_k=sampling.top_k)
        else:
            kwargs.update(temperature=None, top_p=None, top_k=None)
        seqs = model.generate(input_ids=ids.to(device), attention_mask=attn.to(device), **kwargs)
        for k, row in zip(chunk, seqs[:, ids.shape[1]:].tolist()):
            results[k] = cut_at_eos(row, eos, pad)
    model.train(was_training)
    out = Generations([], [], [], [])
    for (index, _), (tokens, truncated) in zip(rows, results):
        out.prompt_index.append(index)
        out.completion_ids.append(tokens)
        out.texts.append(tokenizer.decode(tokens, skip_special_tokens=True))
        out.truncated.append(truncated)
    return out


def generation_order(prompt_lengths: list[int], bucket: bool) -> list[int]:
    """Row order for generation: by prompt length (stable) when bucketing, else as given."""
    rows = range(len(prompt_lengths))
    return sorted(rows, key=lambda k: prompt_lengths[k]) if bucket else list(rows)


def left_pad_to_multiple(ids: torch.Tensor, attn: torch.Tensor, pad_id: int, multiple: int):
    """Left-pad a batch (already left-padded) to a width that is a multiple of `multiple`."""
    extra = (-ids.shape[1]) % multiple if multiple > 1 else 0
    if not extra:
        return ids, attn
    return (torch.cat([ids.new_full((ids.shape[0], extra), pad_id), ids], 1),
            torch.cat([attn.new_zeros((attn.shape[0], extra)), attn], 1))
