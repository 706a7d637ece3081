"""Correcting the rollout engine's mismatch with the trainer (truncated / masked importance sampling).

A serving engine (vLLM) samples with its own kernels, so the probability pi_engine it assigned to
a sampled token differs slightly from pi_old, the trainer's probability of that token under the
same weights. The policy-gradient estimator assumes samples from pi_old; reweighting each token's
loss by pi_old / pi_engine restores that, and truncating or masking the weight bounds its variance
(Yao et al. 2025, "Your efficient RL framework secretly brings you off-policy RL training"; the
masked variant follows Liu et al. 2025's "when speed kills stability"). docs/algorithms.md §12
has the equations.

Registry (IS_CORRECTIONS), one signature:

    fn(old_logp: Tensor[B, T], engine_logp: Tensor[B, T], mask: Tensor[B, T], cfg: ISConfig)
        -> (weights: Tensor[B, T], keep: Tensor[B, T], metrics: dict[str, Tensor])

`weights` (detached) multiply the per-token policy loss; `keep` replaces the response mask, so a
dropped token leaves both the loss and the aggregation's token and sequence counts.

    none   w = 1,            keep = mask
    tis    w = min(r, C),    keep = mask          truncated importance sampling
    mis    w = 1,            keep = mask * [r <= C]   masked importance sampling

with r = exp(old_logp - engine_logp) per token, or per sequence (level=sequence:
r = exp(sum_t (old_logp - engine_logp)), the same weight on each of the sequence's tokens).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from rlft.algos.masked import masked_mean, zero_masked
from rlft.registry import Registry

IS_CORRECTIONS = Registry("importance-sampling correction")
LOG_RATIO_CLAMP = 20.0


@dataclass
class ISConfig:
    level: str = "token"  # token | sequence
    cap: float = 2.0  # C


def engine_log_ratio(old_logp: Tensor, engine_logp: Tensor, mask: Tensor, level: str) -> Tensor:
    """log r [B, T]: per token, or the sequence's sum broadcast over its tokens; 0 where masked."""
    diff = zero_masked((old_logp - engine_logp).detach(), mask)
    if level == "sequence":
        diff = diff.sum(-1, keepdim=True).expand_as(diff)
    elif level != "token":
        raise ValueError(f"unknown importance-sampling level '{level}'; valid: token, sequence")
    return zero_masked(diff.clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP), mask)


def mismatch_metrics(old_logp: Tensor, engine_logp: Tensor, mask: Tensor) -> dict[str, Tensor]:
    """|log pi_old - log pi_engine| over the response tokens: mean and max."""
    gap = zero_masked((old_logp - engine_logp).detach().abs(), mask)
    return {"engine_logp_gap_mean": masked_mean(gap, mask), "engine_logp_gap_max": gap.max() if gap.numel() else gap.sum()}


@IS_CORRECTIONS.register("none")
def no_correction(old_logp: Tensor, engine_logp: Tensor, mask: Tensor, cfg: ISConfig):
    return zero_masked(torch.ones_like(mask, dtype=old_logp.dtype), mask), mask, {
        **mismatch_metrics(old_logp, engine_logp, mask), "is_corrected_frac": mask.new_zeros(())}


@IS_CORRECTIONS.register("tis")
def truncated_is(old_logp: Tensor, engine_logp: Tensor, mask: Tensor, cfg: ISConfig):
    """w = min(r, C); is_corrected_frac: share of tokens whose weight was truncated."""
    ratio = torch.exp(engine_log_ratio(old_logp, engine_logp, mask, cfg.level))
    capped = ratio > cfg.cap
    weights = zero_masked(ratio.clamp(max=cfg.cap), mask)
    return weights, mask, {**mismatch_metrics(old_logp, engine_logp, mask),
                     "is_weight_mean": masked_mean(weights, mask),
                     "is_corrected_frac": masked_mean(capped.to(ratio.dtype), mask)}


@IS_CORRECTIONS.register("mis")
def masked_is(old_logp: Tensor, engine_logp: Tensor, mask: Tensor, cfg: ISConfig):
    """Tokens (or whole sequences) whose ratio exceeds C leave the loss and its counts; the others
    keep weight 1. is_corrected_frac: share of tokens dropped."""
    ratio = torch.exp(engine_log_ratio(old_logp, engine_logp, mask, cfg.level))
    dropped = (ratio > cfg.cap).to(mask.dtype) * mask
    keep = mask - dropped
    return keep.to(old_logp.dtype), keep, {**mismatch_metrics(old_logp, engine_logp, mask),
                                           "is_weight_mean": masked_mean(keep.to(ratio.dtype), mask),
                                           "is_corrected_frac": masked_mean(dropped.to(ratio.dtype), mask)}
