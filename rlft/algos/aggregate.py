"""Reduce a per-token loss matrix to a scalar (docs/algorithms.md §0, "Aggregation modes").

Registry signature (AGGREGATIONS):

    fn(loss: Tensor[B, T], mask: Tensor[B, T], denom: AggDenominator | None = None) -> Tensor[]

Modes (names follow verl `agg_loss`; l = per-token loss, |o_i| = valid tokens of row i):

    seq-mean-token-mean   (1/N_seq) sum_i (1/|o_i|) sum_t l_it        GRPO paper, TRL grpo
    token-mean            sum_it l_it / N_tok                          DAPO, PPO, TRL bnpo/dapo
    seq-mean-token-sum    (1/N_seq) sum_i sum_t l_it
    constant-norm         sum_it l_it / (N_seq * L)                    Dr. GRPO, L = max gen length

Gradient accumulation and data parallelism: N_seq, N_tok and L come from
`denom`, which must hold the counts of the WHOLE optimiser step (all
micro-batches on all ranks). Each micro-batch then contributes a partial sum
and the partial losses add up exactly to the full-batch loss. Build `denom`
with `agg_denominator(mask)` on the full batch, or sum per-micro-batch
denominators with `+` (and all-reduce the counts across ranks). With
denom=None the counts of the given batch are used (single-batch formula).
N_seq counts rows with at least one valid token (verl's seq_mask): a response
dropped from the loss by masking does not dilute the mean.
"""

from __future__ import annotations

from dataclasses import dataclass

from torch import Tensor

from rlft.algos.masked import masked_count, masked_sum
from rlft.registry import Registry

AGGREGATIONS = Registry("loss aggregation")


@dataclass(frozen=True)
class AggDenominator:
    """Global normalisers for one optimiser step.

    num_seqs:   sequences with at least one valid token (N_seq)
    num_tokens: valid tokens (N_tok)
    max_len:    L for constant-norm (Dr. GRPO: the maximum generation length)
    """

    num_seqs: float
    num_tokens: float
    max_len: float

    def __add__(self, other: "AggDenominator") -> "AggDenominator":
        """Combine the counts of two disjoint micro-batches (max_len: the larger)."""
        return AggDenominator(
            num_seqs=self.num_seqs + other.num_seqs,
            num_tokens=self.num_tokens + other.num_tokens,
            max_len=max(self.max_len, other.max_len),
        )


def agg_denominator(mask: Tensor, max_len: float | None = None) -> AggDenominator:
    """Counts of one batch; max_len defaults to the padded width T of `mask`."""
    lengths = masked_count(mask, dim=-1)
    return AggDenominator(
        num_seqs=float((lengths > 0).sum()),
        num_tokens=float(lengths.sum()),
        max_len=float(mask.shape[-1] if max_len is None else max_len),
    )


def _denom(mask: Tensor, denom: AggDenominator | None) -> AggDenominator:
    return agg_denominator(mask) if denom is None else denom


def _nonzero(value: float) -> float:
    # An empty batch has a zero numerator too; dividing by 1 returns 0, not NaN.
    return value if value > 0 else 1.0


@AGGREGATIONS.register("seq-mean-token-mean")
def seq_mean_token_mean(loss: Tensor, mask: Tensor, denom: AggDenominator | None = None) -> Tensor:
    """(1/N_seq) sum_i mean_t l_it; the per-row mean uses the row's own length."""
    d = _denom(mask, denom)
    lengths = masked_count(mask, dim=-1).to(loss.dtype).clamp(min=1)  # [B]
    per_seq = masked_sum(loss, mask, dim=-1) / lengths  # [B]
    return per_seq.sum() / _nonzero(d.num_seqs)


@AGGREGATIONS.register("token-mean")
def token_mean(loss: Tensor, mask: Tensor, denom: AggDenominator | None = None) -> Tensor:
    """sum_it l_it / N_tok."""
    d = _denom(mask, denom)
    return masked_sum(loss, mask) / _nonzero(d.num_tokens)


@AGGREGATIONS.register("seq-mean-token-sum")
def seq_mean_token_sum(loss: Tensor, mask: Tensor, denom: AggDenominator | None = None) -> Tensor:
    """(1/N_seq) sum_it l_it."""
    d = _denom(mask, denom)
    return masked_sum(loss, mask) / _nonzero(d.num_seqs)


@AGGREGATIONS.register("constant-norm")
def constant_norm(loss: Tensor, mask: Tensor, denom: AggDenominator | None = None) -> Tensor:
    """sum_it l_it / (N_seq * L), L = denom.max_len."""
    d = _denom(mask, denom)
    return masked_sum(loss, mask) / _nonzero(d.num_seqs * d.max_len)


def aggregate(loss: Tensor, mask: Tensor, mode: str, denom: AggDenominator | None = None) -> Tensor:
    """Convenience: AGGREGATIONS.get(mode)(loss, mask, denom)."""
    return AGGREGATIONS.get(mode)(loss, mask, denom)


__all__ = ["AGGREGATIONS", "AggDenominator", "agg_denominator", "aggregate"]
