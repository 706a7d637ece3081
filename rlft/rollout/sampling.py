"""The sampling interface every rollout engine implements and every sampling stage calls.

    engine.generate(prompt_ids, n, sampling, seed) -> Generations

Engines (rlft/rollout/generate.py: `hf`, rlft/rollout/vllm_engine.py: `vllm`) import from here and
nothing else of each other, so an engine is one module plus its line in `generate.build_engine`.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import ContextManager, Iterator, Protocol

import torch

ENGINES = ("auto", "hf", "vllm")


@dataclass
class Sampling:
    """What to sample: the distribution and the length."""
    max_new_tokens: int = 128
    do_sample: bool = True  # False: greedy
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0  # 0: off
    suppress_tokens: tuple = ()  # never sampled (benchmarks: fixed-length completions)
    stop: tuple = ()  # strings that end a completion early (an environment's tool call); kept in it

    @classmethod
    def of_rollout(cls, rollout) -> "Sampling":
        """The training rollout's distribution (the `rollout` config section): every stage that samples to
        train (RL, online RFT/DPO, offline RFT, iterative RM data) samples with it."""
        return cls(rollout.max_new_tokens, True, rollout.temperature, rollout.top_p, rollout.top_k)


@dataclass
class Generations:
    prompt_index: list[int]          # which prompt each completion answers
    completion_ids: list[list[int]]  # up to and including the first EOS
    texts: list[str]                 # decoded completion, EOS and padding removed
    truncated: list[bool]            # no EOS within max_new_tokens (nor a stop string)
    logp: list[list[float]] = field(default_factory=list)  # sampler's log-prob of each completion token
    stopped: list[bool] = field(default_factory=list)  # ended on one of Sampling.stop (not EOS, not length)
    token_mask: list[list[int]] | None = None  # 1: a model token, 0: an environment token (multi-turn)
    turns: list[int] | None = None           # model turns of each trajectory (multi-turn)
    tool_calls: list[int] | None = None      # environment replies to tool calls
    tool_errors: list[int] | None = None     # of which the tool reported an error


class RolloutEngine(Protocol):
    """What a sampling engine offers the stages."""
    name: str
    default_is_correction: str
    """The IS correction `rollout.is_correction=auto` picks for it (rlft.algos.IS_CORRECTIONS): none for an engine
    that samples with the trainer's own forward, tis for one with its own kernels."""

    def generate(self, prompt_ids: list[list[int]], n: int, sampling: Sampling,
                 seed: int | None = None) -> Generations: ...

    def sync_weights(self, version: int) -> None:
        """Make the engine sample from the trainer's current weights (`version`: the optimizer
        step they come from; a no-op when the engine already holds them)."""

    def sleep(self) -> None:
        """Free the engine's device memory while the trainer updates (where the engine can)."""

    def wake(self) -> None: ...

    def describe(self) -> str: ...

    def close(self) -> None:
        """Release the engine for good (a later engine in the same process may then start)."""


def cut_at_eos(tokens: list[int], eos_id: int, pad_id: int) -> tuple[list[int], bool]:
    """(tokens up to and including the first EOS, truncated?)"""
    if eos_id in tokens:
        return tokens[:tokens.index(eos_id) + 1], False
    while tokens and tokens[-1] == pad_id and pad_id != eos_id:
        tokens = tokens[:-1]
    return tokens, True


class ModelSource(Protocol):
    """Where an engine finds the weights to sample from: the `Trainer`, or `Frozen`."""
    module: torch.nn.Module

    def gathered(self) -> ContextManager[torch.nn.Module]:
        """The whole module for the duration (ZeRO-3 gathers its parameters once)."""

    def named_weights(self) -> Iterator[tuple[str, torch.Tensor]]:
        """(checkpoint name, full tensor) for every parameter, one at a time."""


def assemble(rows: list[tuple[int, list[int]]], results: list[tuple[list[int], bool, list[float], bool]],
             tokenizer) -> Generations:
    out = Generations([], [], [], [], [], [])
    for (index, _), (tokens, truncated, logp, stopped) in zip(rows, results):
        out.prompt_index.append(index)
        out.completion_ids.append(tokens)
        out.texts.append(tokenizer.decode(tokens, skip_special_tokens=True))
        out.truncated.append(truncated)
        out.logp.append(logp)
        out.stopped.append(stopped)
    return out
