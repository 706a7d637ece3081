"""KL estimators and KL-coefficient controllers (docs/algorithms.md §1, §3).

Registry signature (KL_ESTIMATORS):

    fn(logp: Tensor[B, T], ref_logp: Tensor[B, T]) -> Tensor[B, T]

elementwise per-token estimate of KL(pi_theta || pi_ref) from samples of
pi_theta (or pi_old). With lambda = ref_logp - logp = log(pi_ref / pi_theta):

    k1 = -lambda                 unbiased, high variance, may be negative
    k2 = lambda^2 / 2            biased, low variance
    k3 = exp(lambda) - lambda - 1  unbiased, low variance, >= 0 (GRPO Eq. 4)

Numerics follow verl: lambda is clamped to [-20, 20] and k3 to [-10, 10].
Masking is the caller's job (a sequence KL is `masked_sum(k, mask, -1)`).
Where each is used: k1 inside the reward (PPO, REINFORCE++, RLOO), k3 inside
the loss (GRPO). Gradient of beta*k3 w.r.t. logp is beta*(1 - pi_ref/pi_theta).
"""

from __future__ import annotations

import torch
from torch import Tensor

from rlft.registry import Registry

KL_ESTIMATORS = Registry("KL estimator")

LOG_RATIO_CLAMP = 20.0
K3_CLAMP = 10.0


def _log_ratio(logp: Tensor, ref_logp: Tensor) -> Tensor:
    """lambda = log(pi_ref / pi_theta), clamped to [-20, 20]."""
    return (ref_logp - logp).clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)


@KL_ESTIMATORS.register("k1")
def k1(logp: Tensor, ref_logp: Tensor) -> Tensor:
    """k1 = logp - ref_logp (= -lambda)."""
    return -_log_ratio(logp, ref_logp)


@KL_ESTIMATORS.register("k2")
def k2(logp: Tensor, ref_logp: Tensor) -> Tensor:
    """k2 = (logp - ref_logp)^2 / 2."""
    return 0.5 * _log_ratio(logp, ref_logp) ** 2


@KL_ESTIMATORS.register("k3")
def k3(logp: Tensor, ref_logp: Tensor) -> Tensor:
    """k3 = pi_ref/pi - log(pi_ref/pi) - 1, clamped to [-10, 10]."""
    lam = _log_ratio(logp, ref_logp)
    return (torch.exp(lam) - lam - 1.0).clamp(-K3_CLAMP, K3_CLAMP)


class AdaptiveKLController:
    """Adaptive KL coefficient of Ziegler et al. 2019 (docs/algorithms.md §3).

        e    = clip(KL / KL_target - 1, -0.2, 0.2)
        beta = beta * (1 + e * n_steps / horizon)

    `current_kl` is the batch mean of the sequence-level sum of k1; `n_steps`
    is the number of samples (episodes) since the last update.
    """

    def __init__(self, init_kl_coef: float, target: float, horizon: float):
        if target <= 0 or horizon <= 0:
            raise ValueError(f"adaptive KL needs target > 0 and horizon > 0, got {target}, {horizon}")
        self.value = float(init_kl_coef)
        self.target = float(target)
        self.horizon = float(horizon)

    def update(self, current_kl: float, n_steps: int) -> float:
        error = min(max(float(current_kl) / self.target - 1.0, -0.2), 0.2)
        self.value *= 1.0 + error * n_steps / self.horizon
        return self.value
