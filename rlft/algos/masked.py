"""Masked reductions shared by every algorithm.

Shapes: `x`, `mask` are [B, T]; `mask` is 1 on response tokens (up to and
including the first EOS) and 0 on prompt, padding and post-EOS positions
(docs/algorithms.md §0). Masked positions never contribute to a statistic, even when
they hold NaN or inf: values are selected with `torch.where`, not multiplied.
"""

from __future__ import annotations

from typing import Callable

import torch
from torch import Tensor

WHITEN_EPS = 1e-8  # docs/algorithms.md §1

# Sums a small tensor over every rank (the identity on one rank). Statistics that take one are
# computed over the whole distributed batch instead of this rank's share.
Reduce = Callable[[Tensor], Tensor]


def zero_masked(x: Tensor, mask: Tensor) -> Tensor:
    """x where mask is set, 0 elsewhere (NaN-safe, unlike x * mask)."""
    return torch.where(mask.bool(), x, torch.zeros((), dtype=x.dtype, device=x.device))


def masked_sum(x: Tensor, mask: Tensor, dim: int | None = None) -> Tensor:
    """sum_t m_t x_t over `dim` (all elements if None)."""
    x = zero_masked(x, mask)
    return x.sum() if dim is None else x.sum(dim)


def masked_count(mask: Tensor, dim: int | None = None) -> Tensor:
    """Number of valid positions, as a float tensor of the default dtype."""
    m = mask.bool().to(torch.get_default_dtype())
    return m.sum() if dim is None else m.sum(dim)


def masked_mean(x: Tensor, mask: Tensor, dim: int | None = None) -> Tensor:
    """sum_t m_t x_t / max(sum_t m_t, 1). An all-masked slice gives 0."""
    count = masked_count(mask, dim).to(x.dtype)
    return masked_sum(x, mask, dim) / count.clamp(min=1)


def masked_var(x: Tensor, mask: Tensor, unbiased: bool = True, reduce: Reduce | None = None) -> Tensor:
    """Variance of the valid entries of x (all of them pooled; over all ranks with `reduce`).

    unbiased=True divides by n-1 (TRL/verl), False by n (lm-human-preferences).
    A single valid entry gives variance 0 rather than 0/0.
    """
    return masked_moments(x, mask, unbiased, reduce)[1]


def masked_moments(x: Tensor, mask: Tensor, unbiased: bool = True,
                   reduce: Reduce | None = None) -> tuple[Tensor, Tensor]:
    """(mean, variance) of the valid entries of x, two-pass; `reduce` pools them over ranks."""
    reduce = reduce or (lambda t: t)
    n, total = reduce(torch.stack([masked_count(mask).to(x.dtype), masked_sum(x, mask)]))
    mean = total / n.clamp(min=1)
    sq = reduce(masked_sum((x - mean) ** 2, mask).reshape(1))[0]
    denom = (n - 1) if unbiased else n
    return mean, sq / denom.clamp(min=1)


def whiten(x: Tensor, mask: Tensor, shift_mean: bool = True, unbiased: bool = True,
           reduce: Reduce | None = None) -> Tensor:
    """docs/algorithms.md §1: (x - mean) / sqrt(Var(x) + 1e-8) over valid entries
    (of every rank's batch with `reduce`).

    With shift_mean=False the mean is added back (reward whitening). Masked
    positions of the result are 0.
    """
    mean, var = masked_moments(x, mask, unbiased, reduce)
    out = (x - mean) * torch.rsqrt(var + WHITEN_EPS)
    if not shift_mean:
        out = out + mean
    return zero_masked(out, mask)


def sequence_logp(logp: Tensor, mask: Tensor) -> Tensor:
    """Sequence log-prob s(y) = sum_t m_t logp_t (docs/algorithms.md §0). [B, T] -> [B]."""
    return masked_sum(logp, mask, dim=-1)


def last_valid_index(mask: Tensor) -> Tensor:
    """Column of the last valid token of each row, [B] long; -1 for an empty row."""
    T = mask.shape[-1]
    cols = torch.arange(T, device=mask.device).expand_as(mask)
    return torch.where(mask.bool(), cols, torch.full_like(cols, -1)).max(dim=-1).values
