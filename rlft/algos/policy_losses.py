"""Policy-gradient losses (docs/algorithms.md §1, §4, §5, §10).

Token-level registry (POLICY_LOSSES), used by GRPO, Dr. GRPO, DAPO, PPO, RLOO,
REINFORCE++ and online RFT:

    fn(logp: Tensor[B, T], old_logp: Tensor[B, T] | None, adv: Tensor[B, T],
       mask: Tensor[B, T], cfg: PolicyLossConfig) -> (loss: Tensor[B, T], metrics: dict[str, Tensor])

`loss` is the per-token loss l_t (0 on masked positions), to which the caller
adds beta * KL_ESTIMATORS[...] (GRPO's in-loss KL) before reducing it with an
AGGREGATIONS entry. old_logp=None means on-policy (mu = 1): the ratio is
exp(logp - sg(logp)), identically 1 with gradient rho * grad(logp) (§4).
Metrics are detached scalars.

    ppo_clip    -min(rho A, clip(rho, 1-eps_low, 1+eps_high) A), optional dual clip
    gspo        the same with one length-normalised ratio per sequence (GSPO)
    reinforce   -A * logp (no importance weight; RFT/online RFT: GC = A = I(o))

Pairwise registry (P3O_LOSSES), one entry per `p3o.clip_mode`:

    fn(logp1, old_logp1, mask1, logp2, old_logp2, mask2: Tensor[P, T], delta: Tensor[P],
       cfg: P3OConfig) -> (loss: Tensor[P], metrics: dict[str, Tensor])

Row p of the *1 and *2 tensors holds the two responses of pair p (same
prompt); delta is the detached KL-regularised reward difference from
`p3o_reward_delta`. `loss` is the per-pair numerator; reduce it with
`p3o_aggregate`, which divides by pairs or by tokens (see there).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from rlft.algos.aggregate import AggDenominator
from rlft.algos.masked import masked_count, masked_mean, sequence_logp, zero_masked
from rlft.registry import Registry

POLICY_LOSSES = Registry("policy loss")
P3O_LOSSES = Registry("P3O clip mode")

LOG_RATIO_CLAMP = 20.0  # verl: clamp logp - old_logp before exp (§0)


@dataclass
class PolicyLossConfig:
    eps_low: float = 0.2  # lower clip range: rho >= 1 - eps_low
    eps_high: float = 0.2  # upper clip range: rho <= 1 + eps_high (DAPO clip-higher: 0.28)
    dual_clip_c: float | None = None  # dual clip (verl clip_ratio_c = 3): cap l_t at -c A for A < 0


def importance_ratio(logp: Tensor, old_logp: Tensor | None) -> tuple[Tensor, Tensor]:
    """(rho, log rho) with rho = exp(clamp(logp - old_logp, -20, 20)).

    old_logp=None uses sg(logp): rho == 1 exactly, d rho / d logp = 1 (§4, mu = 1).
    """
    ref = logp.detach() if old_logp is None else old_logp.detach()
    log_ratio = (logp - ref).clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
    return torch.exp(log_ratio), log_ratio


def _ratio_metrics(ratio: Tensor, log_ratio: Tensor, mask: Tensor) -> dict[str, Tensor]:
    ratio, log_ratio = ratio.detach(), log_ratio.detach()
    return {
        "ratio_mean": masked_mean(ratio, mask),
        # k3 estimate of KL(pi_old || pi_theta) on pi_old samples
        "approx_kl": masked_mean(ratio - 1.0 - log_ratio, mask),
    }


@POLICY_LOSSES.register("ppo_clip")
def ppo_clip(
    logp: Tensor, old_logp: Tensor | None, adv: Tensor, mask: Tensor, cfg: PolicyLossConfig
) -> tuple[Tensor, dict[str, Tensor]]:
    """PPO clipped surrogate (§1.2), per token:

        l_t = -min(rho_t A_t, clip(rho_t, 1 - eps_low, 1 + eps_high) A_t)

    The clipped branch is used only when it is the strict minimum, so a tie
    keeps the gradient. Its gradient is zero exactly when A > 0 and
    rho > 1 + eps_high, or A < 0 and rho < 1 - eps_low. Dual clip (A < 0 only):
    l_t = min(l_t, -c A_t). Metrics: clipfrac (masked mean of the clipped-branch
    indicator), clipfrac_dual, ratio_mean, approx_kl.
    """
    ratio, log_ratio = importance_ratio(logp, old_logp)
    adv = zero_masked(adv.detach(), mask)  # padding may hold anything, even NaN
    unclipped = ratio * adv
    clipped = ratio.clamp(1.0 - cfg.eps_low, 1.0 + cfg.eps_high) * adv
    clipped_active = clipped < unclipped
    loss = -torch.where(clipped_active, clipped, unclipped)
    dual_active = torch.zeros_like(clipped_active)
    if cfg.dual_clip_c is not None:
        if cfg.dual_clip_c <= 1.0:
            raise ValueError(f"dual_clip_c must be > 1, got {cfg.dual_clip_c}")
        cap = -cfg.dual_clip_c * adv
        dual_active = (adv < 0) & (loss > cap)
        loss = torch.where(dual_active, cap, loss)
    f = ratio.dtype
    metrics = {
        "clipfrac": masked_mean(clipped_active.to(f), mask),
        "clipfrac_dual": masked_mean(dual_active.to(f), mask),
        **_ratio_metrics(ratio, log_ratio, mask),
    }
    return zero_masked(loss, mask), metrics


@POLICY_LOSSES.register("reinforce")
def reinforce(
    logp: Tensor, old_logp: Tensor | None, adv: Tensor, mask: Tensor, cfg: PolicyLossConfig
) -> tuple[Tensor, dict[str, Tensor]]:
    """Plain policy gradient l_t = -A_t * logp_t (§5: gradient coefficient GC = A).

    No importance weight and no clipping: meant for on-policy updates (RFT and
    online RFT with the `rft` advantage, GC = I(o)). old_logp only feeds the
    ratio metrics; clipfrac is 0.
    """
    loss = -zero_masked(adv.detach(), mask) * logp
    ratio, log_ratio = importance_ratio(logp, old_logp)
    metrics = {
        "clipfrac": torch.zeros((), dtype=logp.dtype, device=logp.device),
        "clipfrac_dual": torch.zeros((), dtype=logp.dtype, device=logp.device),
        **_ratio_metrics(ratio, log_ratio, mask),
    }
    return zero_masked(loss, mask), metrics


@POLICY_LOSSES.register("gspo")
def gspo(
    logp: Tensor, old_logp: Tensor | None, adv: Tensor, mask: Tensor, cfg: PolicyLossConfig
) -> tuple[Tensor, dict[str, Tensor]]:
    """GSPO (Zheng et al. 2025, group sequence policy optimisation), token form: one importance
    ratio per sequence, length-normalised,

        s_i = exp( (1/|y_i|) sum_t (logp_t - old_logp_t) ),   s_{i,t} = sg(s_i) * pi_t / sg(pi_t),
        l_t = -min(s_{i,t} A_t, clip(s_{i,t}, 1 - eps_low, 1 + eps_high) A_t).

    s_{i,t} has the value s_i and the gradient s_i * grad(logp_t), so with a sequence-constant A and
    seq-mean-token-mean aggregation the loss is the paper's sequence objective. Clipping acts on whole
    sequences (the paper's ranges are small, e.g. eps_low 3e-4, eps_high 4e-4). Metrics as ppo_clip.
    """
    ref = logp.detach() if old_logp is None else old_logp.detach()
    token_log_ratio = zero_masked(logp - ref, mask)
    seq_log_ratio = (token_log_ratio.detach().sum(-1) / masked_count(mask, -1).clamp(min=1.0))
    seq_log_ratio = seq_log_ratio.clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
    ratio = torch.exp(seq_log_ratio[:, None] + logp - logp.detach())
    adv = zero_masked(adv.detach(), mask)
    unclipped = ratio * adv
    clipped = ratio.clamp(1.0 - cfg.eps_low, 1.0 + cfg.eps_high) * adv
    clipped_active = clipped < unclipped
    loss = -torch.where(clipped_active, clipped, unclipped)
    metrics = {
        "clipfrac": masked_mean(clipped_active.to(ratio.dtype), mask),
        "clipfrac_dual": torch.zeros((), dtype=logp.dtype, device=logp.device),
        **_ratio_metrics(ratio, seq_log_ratio[:, None].expand_as(ratio), mask),
    }
    return zero_masked(loss, mask), metrics


# ------------------------------------------------------------------ P3O (§10)


@dataclass
class P3OConfig:
    clip_mode: str = "joint"  # P3O_LOSSES name: joint (V2), separate (V1), separate_tokenwise
    eps: float = 0.2  # clip range (log space for joint/tokenwise, ratio space for separate)
    c: float | None = 10.0  # importance weights are clipped to [1/c, c]; None: no clipping
    kl_coef: float = 0.05  # beta in the KL-regularised reward (Eq. 2)
    kl_at: str = "old"  # KL estimate in delta from s_old ("old") or the detached current s ("current")
    avg_tokenwise: bool = False  # joint/separate: the authors' token average (no 1/2; see p3o_aggregate)


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


@P3O_LOSSES.register("joint")
def p3o_joint(
    logp1: Tensor, old_logp1: Tensor, mask1: Tensor, logp2: Tensor, old_logp2: Tensor, mask2: Tensor,
    delta: Tensor, cfg: P3OConfig,
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


@P3O_LOSSES.register("separate")
def p3o_separate(
    logp1: Tensor, old_logp1: Tensor, mask1: Tensor, logp2: Tensor, old_logp2: Tensor, mask2: Tensor,
    delta: Tensor, cfg: P3OConfig,
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


@P3O_LOSSES.register("separate_tokenwise")
def p3o_separate_tokenwise(
    logp1: Tensor, old_logp1: Tensor, mask1: Tensor, logp2: Tensor, old_logp2: Tensor, mask2: Tensor,
    delta: Tensor, cfg: P3OConfig,
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



def p3o_aggregate(loss: Tensor, cfg: P3OConfig, denom: AggDenominator) -> Tensor:
    """Sum of per-pair losses [P] divided by the number of pairs (default: the
    mean over pairs) or, for separate_tokenwise or cfg.avg_tokenwise, by the
    tokens of both responses. `denom` holds the counts of the whole optimiser
    step, summed over ranks (the same for every micro-batch of the step).

    As in the P3O authors' code, the token-averaged form of joint and separate has no 1/2: their
    per-pair losses carry it (the pair mean), so avg_tokenwise divides twice the sum by the tokens."""
    if cfg.clip_mode == "separate_tokenwise":
        return loss.sum() / max(denom.num_tokens, 1.0)
    if cfg.avg_tokenwise:
        return 2.0 * loss.sum() / max(denom.num_tokens, 1.0)
    return loss.sum() / max(denom.num_seqs, 1.0)
