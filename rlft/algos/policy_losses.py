"""Policy-gradient losses (docs/algorithms.md §1, §4, §5, §10).

Token-level registry (POLICY_LOSSES), used by GRPO, Dr. GRPO, DAPO, PPO, RLOO,
REINFORCE++ and online RFT:

    fn(logp: Tensor[B, T], old_logp: Tensor[B, T] | None, adv: Tensor[B, T],
       mask: Tensor[B, T], cfg: PolicyLossConfig) -> (loss: Tensor[B, T], metrics: dict[str, Tensor])

`loss` is the per-token loss l_t (0 on masked positions), to which the caller
adds beta * KL_ESTIMATORS[...] (GRPO's in-loss KL) before reducing it with an
AGGREGATIONS entry. old_logp=None means on-policy (mu = 1): the ratio is
exp(logp - sg(logp)), identically 1 with gradient rho * grad(logp) (§4).
Metrics are detached scalars. Each entry declares the `algo.*` options it reads (`options=`, the
fields of PolicyLossConfig): a new loss with a new option adds the field there and in the `algo`
schema (rlft/config/algorithms.py, `read_when("loss_option")`), nothing else. `per_token=True` declares
that each token's loss depends on that token's own inputs only (not gspo's sequence ratio): the update
then hands the loss to the LM head, which differentiates it chunk by chunk in the forward
(rlft/rollout/lm_head.py, head_loss).

    ppo_clip    -min(rho A, clip(rho, 1-eps_low, 1+eps_high) A), optional dual clip
    gspo        the same with one length-normalised ratio per sequence (GSPO)
    reinforce   -A * logp (no importance weight; RFT/online RFT: GC = A = I(o))

P3O's pairwise losses live in rlft.algos.pairwise.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from rlft.algos.masked import masked_count, masked_mean, zero_masked
from rlft.registry import Registry

POLICY_LOSSES = Registry("policy loss")

LOG_RATIO_CLAMP = 20.0  # verl: clamp logp - old_logp before exp (§0)


@dataclass
class PolicyLossConfig:
    """The options a policy loss reads, named as their `algo.*` keys. Each loss declares the ones it reads
    when it registers (`options=`); the update fills exactly those, and setting another is refused."""
    clip_eps_low: float = 0.2  # lower clip range: rho >= 1 - eps_low
    clip_eps_high: float = 0.2  # upper clip range: rho <= 1 + eps_high (DAPO clip-higher: 0.28)
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


@POLICY_LOSSES.register("ppo_clip", options=("clip_eps_low", "clip_eps_high", "dual_clip_c"), per_token=True)
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
    clipped = ratio.clamp(1.0 - cfg.clip_eps_low, 1.0 + cfg.clip_eps_high) * adv
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


@POLICY_LOSSES.register("reinforce", options=(), per_token=True)
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


@POLICY_LOSSES.register("gspo", options=("clip_eps_low", "clip_eps_high"))
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
    clipped = ratio.clamp(1.0 - cfg.clip_eps_low, 1.0 + cfg.clip_eps_high) * adv
    clipped_active = clipped < unclipped
    loss = -torch.where(clipped_active, clipped, unclipped)
    metrics = {
        "clipfrac": masked_mean(clipped_active.to(ratio.dtype), mask),
        "clipfrac_dual": torch.zeros((), dtype=logp.dtype, device=logp.device),
        **_ratio_metrics(ratio, seq_log_ratio[:, None].expand_as(ratio), mask),
    }
    return zero_masked(loss, mask), metrics
