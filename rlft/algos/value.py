"""Critic-side functions for PPO-RLHF (docs/algorithms.md §3): per-token KL-shaped
rewards, GAE, the clipped value loss and explained variance.

Shapes: [B, T] for logp_old, ref_logp, values, rewards, returns and mask;
[B] for scores. All functions treat only valid tokens (mask = 1) as part of the
episode, so right (or left) padding is handled: the step after the last valid
token has V = 0 and A = 0.
"""

from __future__ import annotations

import torch
from torch import Tensor

from rlft.algos.aggregate import AggDenominator, token_mean
from rlft.algos.kl import KL_ESTIMATORS
from rlft.algos.masked import zero_masked, last_valid_index, masked_mean, masked_var, whiten

__all__ = ["explained_variance", "gae", "kl_shaped_rewards", "score_at_last_token", "value_loss", "whiten"]


def score_at_last_token(score: Tensor, mask: Tensor) -> Tensor:
    """[B] -> [B, T] with score_i on the last valid token of row i, 0 elsewhere.
    Rows without a valid token get nothing."""
    dtype = torch.promote_types(score.dtype, torch.float32)
    out = torch.zeros(mask.shape, dtype=dtype, device=mask.device)
    last = last_valid_index(mask)  # [B]
    rows = torch.nonzero(last >= 0).squeeze(-1)
    out[rows, last[rows]] = score.to(dtype)[rows]
    return out


def kl_shaped_rewards(
    old_logp: Tensor,  # [B, T]
    ref_logp: Tensor,  # [B, T]
    score: Tensor,  # [B]
    mask: Tensor,  # [B, T]
    beta: float,
    kl_estimator: str = "k1",
) -> Tensor:
    """docs/algorithms.md §3: r_t = -beta * k(old_logp_t, ref_logp_t) + 1[t = T_last] * score.

    T_last is the last valid token (EOS when present). k defaults to k1
    (lm-human-preferences, REINFORCE++); TRL allows k3. Masked positions are 0.
    """
    kl = KL_ESTIMATORS.get(kl_estimator)(old_logp, ref_logp)
    return score_at_last_token(score, mask).to(kl.dtype) + zero_masked(-beta * kl, mask)


def gae(
    rewards: Tensor,  # [B, T]
    values: Tensor,  # [B, T]
    mask: Tensor,  # [B, T]
    gamma: float,
    lam: float,
) -> tuple[Tensor, Tensor]:
    """Generalised advantage estimation (arXiv 1506.02438; docs/algorithms.md §3).

        delta_t = r_t + gamma * V_{t+1} - V_t,   A_t = delta_t + gamma * lam * A_{t+1},
        R_t = A_t + V_t,

    over valid tokens only, with V_{T+1} = 0 and A_{T+1} = 0 after the last
    valid token. A masked position inside a row (an environment's tokens in a
    multi-turn trajectory) is not a step: the recursion passes over it, so t+1 is
    the next valid token. Returns (advantages, returns), both 0 on masked
    positions and detached from the graph of `values`.
    """
    m = mask.to(values.dtype)
    values = zero_masked(values.detach(), mask)
    rewards = zero_masked(rewards.detach(), mask)
    B, T = values.shape
    adv = torch.zeros_like(values)
    next_value = torch.zeros(B, dtype=values.dtype, device=values.device)
    next_adv = torch.zeros_like(next_value)
    for t in reversed(range(T)):
        delta = rewards[:, t] + gamma * next_value - values[:, t]
        a_t = (delta + gamma * lam * next_adv) * m[:, t]
        adv[:, t] = a_t
        # a masked position passes the next valid token's value and advantage through
        next_value = torch.where(m[:, t] > 0, values[:, t], next_value)
        next_adv = torch.where(m[:, t] > 0, a_t, next_adv)
    returns = (adv + values) * m
    return adv, returns


def value_loss(
    values: Tensor,  # [B, T] current critic output (requires grad)
    old_values: Tensor,  # [B, T] critic output at rollout time
    returns: Tensor,  # [B, T]
    mask: Tensor,  # [B, T]
    clip_eps: float | None,
    denom: AggDenominator | None = None,
) -> tuple[Tensor, dict[str, Tensor]]:
    """Clipped value loss (docs/algorithms.md §3), token-mean aggregated:

        L_vf = 1/2 * token-mean max((V - R)^2, (clip(V, V_old - eps_v, V_old + eps_v) - R)^2)

    clip_eps=None disables clipping. `denom` carries the global token count for
    gradient accumulation (see rlft.algos.aggregate). Returns (scalar loss,
    metrics) with metrics vf_clipfrac (share of tokens where the clipped branch
    is the strict maximum, i.e. the gradient is zero) and vf_explained_var.
    """
    returns = returns.detach()
    unclipped = (values - returns) ** 2
    if clip_eps is None:
        per_token = unclipped
        clipped_active = torch.zeros_like(unclipped, dtype=torch.bool)
    else:
        old_values = old_values.detach()
        v_clip = torch.clamp(values, old_values - clip_eps, old_values + clip_eps)
        clipped = (v_clip - returns) ** 2
        clipped_active = clipped > unclipped
        per_token = torch.where(clipped_active, clipped, unclipped)
    loss = 0.5 * token_mean(per_token, mask, denom)
    metrics = {
        "vf_clipfrac": masked_mean(clipped_active.to(values.dtype), mask).detach(),
        "vf_explained_var": explained_variance(values.detach(), returns, mask),
    }
    return loss, metrics


def explained_variance(values: Tensor, returns: Tensor, mask: Tensor) -> Tensor:
    """1 - Var(R - V) / Var(R) over valid tokens (1 = perfect critic, 0 = no better
    than a constant). NaN when Var(R) is 0."""
    var_r = masked_var(returns, mask)
    var_res = masked_var(returns - values, mask)
    return 1.0 - var_res / var_r
