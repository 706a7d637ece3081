"""Divergences between the student's and the teacher's next-token distributions at each position of the
student's own samples (on-policy distillation with a full-distribution loss; docs/algorithms.md §16).

Registry signature (DIVERGENCES):

    fn(student_logp: Tensor[N, C], teacher_logp: Tensor[N, C], beta: float) -> Tensor[N]

each row a normalised log-distribution over C categories (the vocabulary, or the teacher's top-k and the rest,
`coarsen`). With S the student and T the teacher:

    forward_kl   KL(T || S) = sum_v T(v) (log T(v) - log S(v))      mass-covering (GKD's "supervised KD" term)
    reverse_kl   KL(S || T) = sum_v S(v) (log S(v) - log T(v))      mode-seeking (the exact form of the
                                                                    sampled-token advantage of algo=distill)
    jsd          beta KL(T || M) + (1 - beta) KL(S || M),  M = beta T + (1 - beta) S,  0 < beta < 1
                 (GKD's generalised JSD: towards forward KL's behaviour as beta -> 0, reverse KL's as beta -> 1)

Terms with zero probability contribute 0. All in fp32 on a chunk of tokens (rlft/rollout/lm_head.py runs
them a chunk at a time, recomputed in the backward).
"""
from __future__ import annotations

import math

import torch
from torch import Tensor

from rlft.registry import Registry

DIVERGENCES = Registry("distillation divergence")


def kl_rows(p_logp: Tensor, q_logp: Tensor) -> Tensor:
    """KL(P || Q) per row of log-distributions [N, C]; categories where P is 0 add nothing."""
    p = p_logp.exp()
    return torch.where(p > 0, p * (p_logp - q_logp), torch.zeros_like(p)).sum(-1)


@DIVERGENCES.register("forward_kl")
def forward_kl(student_logp: Tensor, teacher_logp: Tensor, beta: float = 0.5) -> Tensor:
    return kl_rows(teacher_logp, student_logp)


@DIVERGENCES.register("reverse_kl")
def reverse_kl(student_logp: Tensor, teacher_logp: Tensor, beta: float = 0.5) -> Tensor:
    return kl_rows(student_logp, teacher_logp)


@DIVERGENCES.register("jsd")
def jsd(student_logp: Tensor, teacher_logp: Tensor, beta: float = 0.5) -> Tensor:
    if not 0.0 < beta < 1.0:
        raise ValueError(f"jsd needs 0 < beta < 1 (got {beta}); forward_kl and reverse_kl are its limits")
    mixture = torch.logsumexp(torch.stack([teacher_logp + math.log(beta), student_logp + math.log(1.0 - beta)]), 0)
    return beta * kl_rows(teacher_logp, mixture) + (1.0 - beta) * kl_rows(student_logp, mixture)


def log1mexp(x: Tensor) -> Tensor:
    """log(1 - exp(x)) for x <= 0, kept finite where exp(x) rounds to 1 (the rest's mass is then ~1e-7)."""
    return torch.log(-torch.expm1(x.clamp(max=-1e-7)))


def coarsen(student_logp: Tensor, teacher_logp: Tensor, top_k: int) -> tuple[Tensor, Tensor]:
    """Both distributions over the teacher's `top_k` likeliest tokens of each row plus one category for all the
    others ([N, top_k + 1]): a divergence of these lower-bounds the full one and equals it when the rest is
    empty. top_k = 0 (or >= the vocabulary): unchanged."""
    if top_k <= 0 or top_k >= teacher_logp.shape[-1]:
        return student_logp, teacher_logp
    t_top, ids = teacher_logp.topk(top_k, dim=-1)
    s_top = student_logp.gather(-1, ids)
    rest = lambda top: log1mexp(torch.logsumexp(top, -1, keepdim=True))  # noqa: E731
    return torch.cat([s_top, rest(s_top)], -1), torch.cat([t_top, rest(t_top)], -1)


def token_divergence(student_logits: Tensor, teacher_logits: Tensor, kind: str, beta: float = 0.5,
                     top_k: int = 0) -> Tensor:
    """The registered divergence `kind` per row of fp32 logits [N, V] (already divided by the temperature),
    over the whole vocabulary or the teacher's top-k (`coarsen`). Gradients flow to the student's logits."""
    student, teacher = coarsen(student_logits.log_softmax(-1), teacher_logits.log_softmax(-1), top_k)
    return DIVERGENCES.get(kind)(student, teacher, beta)
