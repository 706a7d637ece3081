"""Preference and reward-model losses (docs/algorithms.md §2, §5, §9).

    dpo_loss            DPO on sequence log-probs, optionally length-normalised (§9, §5 Eq. 12)
    bradley_terry_loss  outcome RM pairwise loss -log sigma(r_w - r_l) (§2.1)
    prm_bce_loss        Math-Shepherd process RM: BCE over steps (§2.2)
    solution_score_min  PRM solution score = min over steps (§2.2)
    math_shepherd_labels hard / soft step labels from completer outcomes (§2.2)

Shapes: one value per pair [P] for DPO/BT, [N, K] for rankings, [N, S] for
step-level PRM tensors. Every loss uses -logsigmoid / BCE-with-logits style
numerics, never log(sigmoid(.)).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from rlft.algos.masked import masked_count, masked_sum


def dpo_loss(
    s_w: Tensor,  # [P] policy sequence log-prob of the chosen response
    s_l: Tensor,  # [P] ... of the rejected response
    ref_w: Tensor,  # [P] reference sequence log-prob of the chosen response
    ref_l: Tensor,  # [P] ... of the rejected response
    beta: float,
    length_normalize: bool = False,
    len_w: Tensor | None = None,  # [P] chosen response lengths (length_normalize only)
    len_l: Tensor | None = None,  # [P] rejected response lengths
) -> tuple[Tensor, dict[str, Tensor]]:
    """DPO (arXiv 2305.18290 Eq. 7), per pair:

        h_w = beta (s_w - ref_w),  h_l = beta (s_l - ref_l),  L = -log sigma(h_w - h_l)

    dL/ds_w = -beta sigma(h_l - h_w) = -dL/ds_l. With length_normalize=True the
    log-ratios are divided by the response lengths (DeepSeekMath Eq. 12).
    Metrics (detached batch means): chosen_reward, rejected_reward, margin,
    accuracy (share of pairs with h_w > h_l).
    """
    ratio_w, ratio_l = s_w - ref_w.detach(), s_l - ref_l.detach()
    if length_normalize:
        if len_w is None or len_l is None:
            raise ValueError("dpo_loss with length_normalize=True needs len_w and len_l")
        ratio_w = ratio_w / len_w.clamp(min=1)
        ratio_l = ratio_l / len_l.clamp(min=1)
    h_w, h_l = beta * ratio_w, beta * ratio_l
    margin = h_w - h_l
    loss = -F.logsigmoid(margin)
    metrics = {
        "chosen_reward": h_w.detach().mean(),
        "rejected_reward": h_l.detach().mean(),
        "margin": margin.detach().mean(),
        "accuracy": (margin.detach() > 0).to(margin.dtype).mean(),
    }
    return loss, metrics


def bradley_terry_loss(r_w: Tensor, r_l: Tensor) -> Tensor:
    """-log sigma(r_w - r_l) per pair (InstructGPT Eq. 1). P(w > l) = sigma(r_w - r_l)."""
    return -F.logsigmoid(r_w - r_l)



def prm_bce_loss(
    pred: Tensor,  # [N, S] step predictions (logits, or probabilities when from_logits=False)
    labels: Tensor,  # [N, S] step labels in [0, 1] (hard or soft)
    mask: Tensor,  # [N, S] valid steps
    from_logits: bool = True,
    reduction: str = "sum",
    good_weight: float = 1.0,
) -> Tensor:
    """Math-Shepherd PRM loss (§2.2), per solution [N]:

        -sum_i [y_i log p_i + (1 - y_i) log(1 - p_i)]   over valid steps (reduction="sum"),

    or its mean over valid steps (reduction="mean"). Logits are the stable
    default; probabilities are clamped by torch's BCE (log >= -100). `good_weight` multiplies
    the y log p term (BCE's pos_weight): > 1 counts good steps more when they are the minority.
    """
    labels = labels.to(pred.dtype)
    if from_logits:
        weight = torch.tensor(good_weight, dtype=pred.dtype, device=pred.device)
        bce = F.binary_cross_entropy_with_logits(pred, labels, reduction="none", pos_weight=weight)
    else:
        bce = F.binary_cross_entropy(pred, labels, reduction="none")
        bce = bce + (good_weight - 1.0) * labels * -torch.log(pred.clamp(min=1e-44)).clamp(max=100.0)
    total = masked_sum(bce, mask, dim=-1)
    if reduction == "sum":
        return total
    if reduction == "mean":
        return total / masked_count(mask, dim=-1).to(total.dtype).clamp(min=1)
    raise ValueError(f"unknown PRM loss reduction '{reduction}'; valid: mean, sum")


def solution_score_min(step_probs: Tensor, mask: Tensor | None = None) -> Tensor:
    """PRM solution-level score: min over (valid) steps of p_step. [N, S] -> [N]."""
    if mask is not None:
        step_probs = torch.where(mask.bool(), step_probs, torch.full_like(step_probs, float("inf")))
    return step_probs.amin(dim=-1)


def math_shepherd_labels(num_reaching_gold: Tensor, num_completions: int) -> tuple[Tensor, Tensor]:
    """Step labels from N completer rollouts per step prefix (§2.2):
    hard = 1 if any completion reaches the gold answer, soft = fraction that do."""
    if num_completions < 1:
        raise ValueError(f"num_completions must be >= 1, got {num_completions}")
    n = num_reaching_gold.to(torch.get_default_dtype())
    return (n > 0).to(n.dtype), n / num_completions
