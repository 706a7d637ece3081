"""Pairwise losses (docs/algorithms.md §9, §10): P3O's clipped pairwise policy gradient and online DPO.

The RL loop's pairwise update (algo.pairwise_loss set) pairs rows (2j, 2j+1) of a rollout, two
completions of one prompt, and calls one PAIRWISE_LOSSES entry per micro-batch:

    fn(batch: PairBatch, cfg: PairLossConfig, counts: PairCounts) -> (loss: scalar, metrics: {name: (sum, count)})

`loss` is already divided by the optimizer step's global count (pairs, tokens or untied pairs,
summed over micro-batches and ranks), so micro-batch losses add up to the step's loss.

    p3o_joint               V2, joint clipping of the pair's log-ratio (P3O's default)
    p3o_separate            V1, each sequence ratio clipped on its own
    p3o_separate_tokenwise  V1 per token (the authors' clip_tokenwise), averaged over tokens
    dpo                     online DPO: the higher-reward completion is chosen, ties dropped

An entry declares what it reads beyond the pair (`needs`: reference, kl_coef) and which
`pairwise.*` options apply to it (`options`); the config check refuses the others.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from rlft.algos.masked import masked_count, sequence_logp, zero_masked
from rlft.algos.policy_losses import LOG_RATIO_CLAMP
from rlft.algos.preference import dpo_loss
from rlft.registry import Registry

PAIRWISE_LOSSES = Registry("pairwise loss")


@dataclass
class PairLossConfig:
    eps: float = 0.2  # P3O clip range (log space for joint/tokenwise, ratio space for separate)
    c: float | None = 10.0  # P3O importance weights are clipped to [1/c, c]; None: no clipping
    kl_coef: float = 0.05  # P3O: beta in the KL-regularised reward (Eq. 2)
    kl_at: str = "old"  # P3O: KL estimate in delta from s_old ("old") or the detached current s ("current")
    avg_tokenwise: bool = False  # P3O joint/separate: the authors' token average (see p3o_aggregate)
    beta: float = 0.1  # DPO's beta
    length_normalize: bool = False  # DPO: length-normalised log-ratios (DeepSeekMath Eq. 12)


@dataclass
class PairCounts:
    """Counts of a whole optimizer step, summed over micro-batches and ranks."""
    pairs: float
    tokens: float  # response tokens of both completions
    untied: float = 0.0  # pairs whose rewards differ


@dataclass
class PairBatch:
    """One micro-batch: rows 2j and 2j+1 of the per-token tensors [2P, T] are pair j."""
    logp: Tensor  # current policy, with grad
    old_logp: Tensor  # rollout policy
    mask: Tensor
    ref_logp: Tensor | None  # reference (None without one)
    scores: Tensor  # [P, 2] rewards, float64
    s_ref: Tensor  # [P, 2] reference sequence log-probs (the rollout policy's without a reference), float64
    delta: Tensor  # [P] KL-regularised reward difference at the rollout policy (p3o_reward_delta)


def as_pairs(x: Tensor) -> Tensor:
    """[2P, ...] rows (2j, 2j+1) -> [P, 2, ...]."""
    return torch.stack([x[0::2], x[1::2]], 1)


def pair_rollout_inputs(scores: Tensor, old_logp: Tensor, ref_logp: Tensor | None, mask: Tensor,
                        group_size: int, kl_coef: float) -> tuple[Tensor, Tensor, Tensor]:
    """Per pair of a rollout: (scores [P, 2], s_ref [P, 2], delta [P]), the first two in float64 so
    that a per-prompt reward shift cancels exactly rather than to fp32 rounding (§10)."""
    idx1, idx2 = p3o_pair_indices(len(scores), group_size)
    s_old = sequence_logp(old_logp, mask)
    s_ref = sequence_logp(ref_logp, mask) if ref_logp is not None else s_old
    pair_scores = torch.stack([scores[idx1], scores[idx2]], -1).double()
    pair_s_ref = torch.stack([s_ref[idx1], s_ref[idx2]], -1).double()
    s_old2 = torch.stack([s_old[idx1], s_old[idx2]], -1).double()
    return pair_scores, pair_s_ref, p3o_reward_delta(pair_scores, s_old2, pair_s_ref, kl_coef).float()


def p3o_reward_delta(scores: Tensor, s_old: Tensor, s_ref: Tensor, beta: float) -> Tensor:
    """Delta = r^(y1) - r^(y2), r^(y) = r(y) - beta * (s_old(y) - s_ref(y))  (§10, Eq. 2).

    scores, s_old, s_ref: [P, 2] (column j = response j of the pair). For
    kl_at="current" pass the detached current sequence log-probs as s_old.
    A per-prompt shift of the scores cancels. Returns detached [P].
    """
    r_hat = scores - beta * (s_old - s_ref)
    return (r_hat[..., 0] - r_hat[..., 1]).detach()


def p3o_pair_indices(batch_size: int, group_size: int) -> tuple[Tensor, Tensor]:
    """Disjoint consecutive pairs within each contiguous group (§10, [spec] for G > 2):
    rows (kG + 2j, kG + 2j + 1). Returns (idx1, idx2), each [batch_size // 2] long."""
    if group_size < 2 or group_size % 2:
        raise ValueError(f"P3O pairs responses of one prompt: group_size must be even and >= 2, got {group_size}")
    if batch_size % group_size:
        raise ValueError(f"batch of {batch_size} responses is not a whole number of groups of {group_size}")
    first = torch.arange(0, batch_size, 2)
    return first, first + 1


def _is_weight(log_w: Tensor, c: float | None) -> Tensor:
    """sg(clip(exp(log_w), 1/c, c)), exponent clamped to [-20, 20]."""
    w = torch.exp(log_w.detach().clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP))
    return w if c is None else w.clamp(1.0 / c, c)


def _seq_log_ratios(
    logp1: Tensor, old_logp1: Tensor, mask1: Tensor, logp2: Tensor, old_logp2: Tensor, mask2: Tensor
) -> tuple[Tensor, Tensor]:
    lr1 = sequence_logp(logp1, mask1) - sequence_logp(old_logp1.detach(), mask1)
    lr2 = sequence_logp(logp2, mask2) - sequence_logp(old_logp2.detach(), mask2)
    return lr1, lr2  # [P] each: s_j - s_j^old


def p3o_joint(
    logp1: Tensor, old_logp1: Tensor, mask1: Tensor, logp2: Tensor, old_logp2: Tensor, mask2: Tensor,
    delta: Tensor, cfg: PairLossConfig,
) -> tuple[Tensor, dict[str, Tensor]]:
    """V2, joint clipping (normative; authors' p3o_loss with clip_tokenwise=False):

        log R = (s1 - s2) - (s1_old - s2_old),  w = sg(clip(rho1 rho2, 1/c, c)),
        L = -1/2 w min(Delta log R, Delta clip(log R, -eps, eps)).

    Unclipped: dL/ds1 = -w Delta / 2 = -dL/ds2. Zero gradient when Delta > 0 and
    log R > eps, or Delta < 0 and log R < -eps.
    """
    lr1, lr2 = _seq_log_ratios(logp1, old_logp1, mask1, logp2, old_logp2, mask2)
    delta = delta.detach()
    w = _is_weight(lr1 + lr2, cfg.c)
    log_r = lr1 - lr2
    unclipped = delta * log_r
    clipped = delta * log_r.clamp(-cfg.eps, cfg.eps)
    clipped_active = clipped < unclipped
    loss = -0.5 * w * torch.where(clipped_active, clipped, unclipped)
    return loss, _p3o_metrics(clipped_active.to(w.dtype).mean(), w, delta)


def p3o_separate(
    logp1: Tensor, old_logp1: Tensor, mask1: Tensor, logp2: Tensor, old_logp2: Tensor, mask2: Tensor,
    delta: Tensor, cfg: PairLossConfig,
) -> tuple[Tensor, dict[str, Tensor]]:
    """V1, separate clipping (sequence ratios rho_j = exp(s_j - s_j_old)):

        L = -1/2 [ sg(rho2) min(rho1 Delta, clip(rho1, 1 +- eps) Delta)
                 + sg(rho1) min(-rho2 Delta, -clip(rho2, 1 +- eps) Delta) ],

    sg-weights clipped to [1/c, c]. Unclipped, the gradient equals the
    importance-sampled pairwise gradient rho1 rho2 Delta grad(s1 - s2) / 2.
    """
    lr1, lr2 = _seq_log_ratios(logp1, old_logp1, mask1, logp2, old_logp2, mask2)
    delta = delta.detach()
    rho1 = torch.exp(lr1.clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP))
    rho2 = torch.exp(lr2.clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP))
    w1, w2 = _is_weight(lr1, cfg.c), _is_weight(lr2, cfg.c)
    lo, hi = 1.0 - cfg.eps, 1.0 + cfg.eps

    u1, c1 = rho1 * delta, rho1.clamp(lo, hi) * delta
    u2, c2 = -rho2 * delta, -rho2.clamp(lo, hi) * delta
    clip1, clip2 = c1 < u1, c2 < u2
    term1 = torch.where(clip1, c1, u1)
    term2 = torch.where(clip2, c2, u2)
    loss = -0.5 * (w2 * term1 + w1 * term2)
    clipfrac = (clip1.to(rho1.dtype).mean() + clip2.to(rho1.dtype).mean()) / 2
    return loss, _p3o_metrics(clipfrac, _is_weight(lr1 + lr2, cfg.c), delta)


def p3o_separate_tokenwise(
    logp1: Tensor, old_logp1: Tensor, mask1: Tensor, logp2: Tensor, old_logp2: Tensor, mask2: Tensor,
    delta: Tensor, cfg: PairLossConfig,
) -> tuple[Tensor, dict[str, Tensor]]:
    """Token-level V1 (authors' clip_tokenwise=True). With omega = -Delta w,
    w = sg(clip(rho1 rho2, 1/c, c)) from sequence ratios:

        y1 token t: max(omega l_t,  omega clamp(l_t, l_old_t +- eps))
        y2 token t: max(-omega l_t, -omega clamp(l_t, l_old_t +- eps))

    The per-pair value is the SUM over valid tokens of both responses; the
    authors divide by n = valid tokens of both responses (p3o_aggregate).
    """
    lr1, lr2 = _seq_log_ratios(logp1, old_logp1, mask1, logp2, old_logp2, mask2)
    w = _is_weight(lr1 + lr2, cfg.c)
    omega = (-delta.detach() * w).unsqueeze(-1)  # [P, 1]

    def side(logp: Tensor, old_logp: Tensor, mask: Tensor, sign: float) -> tuple[Tensor, Tensor]:
        old_logp = old_logp.detach()
        unclipped = sign * omega * logp
        clipped = sign * omega * torch.clamp(logp, old_logp - cfg.eps, old_logp + cfg.eps)
        clipped_active = clipped > unclipped
        per_token = zero_masked(torch.where(clipped_active, clipped, unclipped), mask)
        return per_token.sum(-1), zero_masked(clipped_active.to(w.dtype), mask).sum()

    loss1, nclip1 = side(logp1, old_logp1, mask1, 1.0)
    loss2, nclip2 = side(logp2, old_logp2, mask2, -1.0)
    n_tok = (masked_count(mask1) + masked_count(mask2)).clamp(min=1)
    return loss1 + loss2, _p3o_metrics((nclip1 + nclip2) / n_tok, w, delta)


def _p3o_metrics(clipfrac: Tensor, w: Tensor, delta: Tensor) -> dict[str, Tensor]:
    return {
        "clipfrac": clipfrac.detach(),
        "is_weight_mean": w.detach().mean(),
        "delta_abs_mean": delta.detach().abs().mean(),
    }


def p3o_aggregate(loss: Tensor, counts: PairCounts, tokenwise: bool = False, avg_tokenwise: bool = False) -> Tensor:
    """Sum of per-pair losses [P] divided by the step's pairs (default: the mean over pairs) or, for
    the tokenwise loss or avg_tokenwise, by the tokens of both responses.

    As in the P3O authors' code, the token-averaged form of joint and separate has no 1/2: their
    per-pair losses carry it (the pair mean), so avg_tokenwise divides twice the sum by the tokens."""
    if tokenwise:
        return loss.sum() / max(counts.tokens, 1.0)
    if avg_tokenwise:
        return 2.0 * loss.sum() / max(counts.tokens, 1.0)
    return loss.sum() / max(counts.pairs, 1.0)


def _p3o_entry(per_pair_loss, tokenwise: bool):
    def loss(batch: PairBatch, cfg: PairLossConfig, counts: PairCounts):
        delta = batch.delta
        if cfg.kl_at == "current":  # the KL term of delta from the current (detached) policy
            s_now = as_pairs(sequence_logp(batch.logp.detach(), batch.mask)).double()
            delta = p3o_reward_delta(batch.scores, s_now, batch.s_ref, cfg.kl_coef).float()
        lp, old, m = batch.logp, batch.old_logp, batch.mask
        per_pair, metrics = per_pair_loss(lp[0::2], old[0::2], m[0::2], lp[1::2], old[1::2], m[1::2], delta, cfg)
        n = float(delta.numel())
        return p3o_aggregate(per_pair, counts, tokenwise, cfg.avg_tokenwise), {
            "clipfrac": (metrics["clipfrac"].item() * n, n), "is_weight": (metrics["is_weight_mean"].item() * n, n),
            "delta_abs": (float(delta.abs().sum()), n)}
    loss.__doc__ = f"P3O with {per_pair_loss.__name__} per pair (§10)."
    return loss


P3O_OPTIONS = ("clip_eps_low", "c", "kl_at", "avg_tokenwise")  # algo.clip_eps_low and pairwise.*
PAIRWISE_LOSSES.register("p3o_joint", needs=("kl_coef",), options=P3O_OPTIONS)(_p3o_entry(p3o_joint, False))
PAIRWISE_LOSSES.register("p3o_separate", needs=("kl_coef",), options=P3O_OPTIONS)(_p3o_entry(p3o_separate, False))
PAIRWISE_LOSSES.register("p3o_separate_tokenwise", needs=("kl_coef",), options=("clip_eps_low", "c", "kl_at"))(
    _p3o_entry(p3o_separate_tokenwise, True))


def online_dpo_pair_loss(logp: Tensor, mask: Tensor, ref_logp: Tensor, score_diff: Tensor, beta: float,
                         length_normalize: bool) -> tuple[Tensor, Tensor]:
    """Online DPO (§9): per pair (rows 2j, 2j+1) the higher-reward completion is chosen; ties give
    no loss. Returns (per-pair loss [P], kept [P] 0/1)."""
    s, s_ref, lengths = sequence_logp(logp, mask), sequence_logp(ref_logp, mask), mask.sum(-1)
    first = score_diff > 0
    kept = (score_diff != 0).to(logp.dtype)

    def pick(x: Tensor, chosen: bool) -> Tensor:
        return torch.where(first, x[0::2], x[1::2]) if chosen else torch.where(first, x[1::2], x[0::2])

    loss, _ = dpo_loss(pick(s, True), pick(s, False), pick(s_ref, True), pick(s_ref, False), beta,
                       length_normalize, pick(lengths, True), pick(lengths, False))
    return loss * kept, kept


@PAIRWISE_LOSSES.register("dpo", needs=("reference",), options=("beta", "length_normalize"))
def online_dpo(batch: PairBatch, cfg: PairLossConfig, counts: PairCounts):
    """Online DPO against the reference, the mean over the step's untied pairs."""
    diff = batch.scores[:, 0] - batch.scores[:, 1]
    loss, kept = online_dpo_pair_loss(batch.logp, batch.mask, batch.ref_logp, diff, cfg.beta, cfg.length_normalize)
    return loss.sum() / max(counts.untied, 1.0), {"dpo_loss": (float(loss.sum()), float(kept.sum())),
                                                   "pairs_kept": (float(kept.sum()), float(kept.numel()))}
