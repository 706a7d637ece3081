"""Advantage estimators (docs/algorithms.md §3, §4, §5, §6, §8) and reward shaping.

Registry signature (ADVANTAGES):

    fn(batch: AdvantageInputs, cfg: AdvantageConfig) -> AdvantageOutput(adv [B, T], returns [B, T] | None)

An entry that needs more than scores says so when registered: "groups" (at least 2 completions
per prompt), "critic" (values from a critic the stage trains), "step_scores" (a PRM's per-step
scores), "kl_reward" (it folds the KL to the reference into its rewards: algo.kl_in=reward), "teacher"
(a teacher model's log-probs of the sampled tokens).

`adv` is per token and 0 on masked positions; `returns` is set by estimators
that have them (gae: critic targets; reinforce_pp*: returns-to-go), else None.
Responses are laid out contiguously, `group_size` (G) per prompt: rows
[k*G, (k+1)*G) share prompt k. Group-relative estimators reject G < 2.

    grpo                   (r - mean_g r) / (std_g r + eps_adv), broadcast over tokens (§4)
    dr_grpo                r - mean_g r  (grpo without std scaling, §6)
    grpo_process           pooled step-reward normalisation, A_t = sum of steps ending at or after t
                           (+ outcome_weight x the grpo advantage) (§4)
    grpo_process_min       min-form credit: V_j = min of step rewards from j on, pooled and
                           normalised, the tokens of step j get V~_j (+ outcome_weight) (§4)
    rloo                   R = score - beta * sum_t k1;  A_i = R_i - mean_{j != i} R_j (§8)
    reinforce_pp           returns-to-go of r_t = 1[t=T] score - beta k1_t, global whitening (§8)
    reinforce_pp_baseline  as reinforce_pp after subtracting the group-mean score (§8)
    gae                    PPO: KL-shaped token rewards, GAE, optional whitening (§3)
    rft                    online RFT: 1[score > rft_threshold] broadcast over tokens (§5)
    distill                on-policy distillation: distill_coef x (log pi_teacher - log pi_old) of each
                           sampled token (+ outcome_weight x the grpo advantage) (§16)

KL-in-reward estimators (rloo, reinforce_pp*, gae) use cfg.kl_coef and need
old_logp and ref_logp when it is non-zero; the KL is taken at pi_old.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple, Sequence

import torch
from torch import Tensor

from rlft.algos.kl import KL_ESTIMATORS
from rlft.algos.masked import Reduce, masked_moments, masked_sum, whiten, zero_masked
from rlft.algos.value import gae as gae_recursion
from rlft.algos.value import score_at_last_token
from rlft.registry import Registry

ADVANTAGES = Registry("advantage estimator")


@dataclass
class AdvantageInputs:
    """Everything an estimator may read. Shapes: B responses, T token columns."""

    scores: Tensor  # [B] outcome reward per response
    mask: Tensor  # [B, T] response mask
    group_size: int = 1  # G responses per prompt, contiguous rows
    step_ends: Sequence[Sequence[int]] | None = None  # per response: 0-based column of each step's last token
    step_scores: Sequence[Sequence[float]] | None = None  # per response: PRM score of each step
    old_logp: Tensor | None = None  # [B, T] log-probs under pi_old (KL-in-reward estimators)
    ref_logp: Tensor | None = None  # [B, T] log-probs under pi_ref
    values: Tensor | None = None  # [B, T] critic values at rollout (gae)
    teacher_logp: Tensor | None = None  # [B, T] log-probs under the teacher (distill)


@dataclass
class AdvantageConfig:
    """Options read by the estimators; each ignores those it does not use."""

    eps_adv: float = 1e-4  # added to the group std (TRL 1e-4, verl 1e-6)
    std_unbiased: bool = True  # Bessel (n-1) std, as TRL/verl; False = population std
    scale_by_std: bool = True  # grpo: divide by the std; False = Dr. GRPO mean-only
    kl_coef: float = 0.0  # beta of the KL penalty inside the reward (rloo, reinforce_pp*, gae)
    kl_estimator: str = "k3"  # estimator for that in-reward KL (the config's default; PPO, RLOO, REINFORCE++: k1)
    gamma: float = 1.0  # discount (gae, reinforce_pp*)
    lam: float = 0.95  # GAE lambda
    whiten_advantages: bool = True  # gae: whiten A over the batch
    whiten_unbiased: bool = True  # gae: unbiased variance for whitening
    whiten_rewards: bool = False  # gae: whiten token rewards with shift_mean=False
    rft_threshold: float = 0.5  # rft: a response is correct when score > threshold
    outcome_weight: float = 0.0  # grpo_process, distill: weight of the outcome (grpo) advantage added to every token
    distill_coef: float = 1.0  # distill: weight of the per-token teacher signal
    distill_sampled: bool = True  # distill: the teacher signal is this advantage (False: a divergence in the loss)
    reduce: Reduce | None = None  # whitening statistics over every rank's rollout (None: this batch)


class AdvantageOutput(NamedTuple):
    adv: Tensor  # [B, T]
    returns: Tensor | None  # [B, T] or None


# ------------------------------------------------------------------ group helpers


def check_group_size(batch_size: int, group_size: int) -> int:
    """Validate the contiguous group layout; returns the number of groups."""
    if group_size < 2:
        raise ValueError(
            f"group-relative advantages need group_size >= 2 responses per prompt, got {group_size}; "
            "with one response the group baseline is the response itself"
        )
    if batch_size % group_size != 0:
        raise ValueError(f"batch of {batch_size} responses is not a whole number of groups of {group_size}")
    return batch_size // group_size


def _grouped(scores: Tensor, group_size: int) -> Tensor:
    """[B] -> [num_groups, G]."""
    n = check_group_size(scores.shape[0], group_size)
    return scores.to(_float_dtype(scores)).reshape(n, group_size)


def group_stats(scores: Tensor, group_size: int, unbiased: bool = True) -> tuple[Tensor, Tensor]:
    """Per-group mean and std of scores [B]; returns two [num_groups] tensors."""
    g = _grouped(scores, group_size)
    return g.mean(-1), g.std(-1, correction=1 if unbiased else 0)


def zero_std_groups(scores: Tensor, group_size: int) -> Tensor:
    """bool [num_groups]: every score of the group is equal."""
    g = _grouped(scores, group_size)
    return g.amax(-1) == g.amin(-1)


def frac_zero_std_groups(scores: Tensor, group_size: int) -> Tensor:
    """Share of groups whose rewards are all equal (logged as frac_reward_zero_std)."""
    return zero_std_groups(scores, group_size).float().mean()


def dynamic_sampling_keep_mask(scores: Tensor, group_size: int) -> Tensor:
    """DAPO dynamic sampling (§7): bool [num_groups], False for groups whose
    rewards are all equal (all correct or all wrong), which carry no signal."""
    return ~zero_std_groups(scores, group_size)


def group_normalize(
    scores: Tensor, group_size: int, eps: float = 1e-4, unbiased: bool = True, scale: bool = True
) -> Tensor:
    """GRPO outcome advantage per response [B] (§4.1.2):

        (r_i - mean(r)) / (std(r) + eps)      or   r_i - mean(r)   when scale=False (Dr. GRPO)

    A group with all-equal rewards gets exactly 0 (std = 0 case, §4 edge cases).
    """
    g = _grouped(scores, group_size)
    centred = g - g.mean(-1, keepdim=True)
    if scale:
        centred = centred / (g.std(-1, keepdim=True, correction=1 if unbiased else 0) + eps)
    flat = (g.amax(-1) == g.amin(-1)).unsqueeze(-1)
    return torch.where(flat, torch.zeros_like(centred), centred).reshape(-1)


def leave_one_out(scores: Tensor, group_size: int) -> Tensor:
    """RLOO advantage per response [B]: R_i - (sum_j R_j - R_i) / (G - 1)."""
    g = _grouped(scores, group_size)
    baseline = (g.sum(-1, keepdim=True) - g) / (group_size - 1)
    return (g - baseline).reshape(-1)



def _broadcast(per_seq: Tensor, mask: Tensor) -> Tensor:
    """[B] -> [B, T], 0 on masked positions."""
    per_seq = per_seq.to(_float_dtype(per_seq))
    return zero_masked(per_seq.unsqueeze(-1).expand(mask.shape), mask)


def _float_dtype(x: Tensor) -> torch.dtype:
    """x's dtype when it is float32/float64, else float32 (ints, bools, bf16)."""
    return torch.promote_types(x.dtype, torch.float32)


def _kl_per_token(batch: AdvantageInputs, cfg: AdvantageConfig, what: str) -> Tensor | None:
    """In-reward KL [B, T] at pi_old, or None when cfg.kl_coef is 0."""
    if cfg.kl_coef == 0:
        return None
    if batch.old_logp is None or batch.ref_logp is None:
        raise ValueError(f"{what} with kl_coef={cfg.kl_coef} needs old_logp and ref_logp")
    return KL_ESTIMATORS.get(cfg.kl_estimator)(batch.old_logp, batch.ref_logp)


def _token_rewards(batch: AdvantageInputs, cfg: AdvantageConfig, scores: Tensor, what: str) -> Tensor:
    """r_t = 1[t = T_last] * score - beta * KL_t  ([B, T], §3/§8)."""
    rewards = score_at_last_token(scores, batch.mask)
    kl = _kl_per_token(batch, cfg, what)
    if kl is not None:
        rewards = rewards.to(kl.dtype) - cfg.kl_coef * zero_masked(kl, batch.mask)
    return rewards


# ------------------------------------------------------------------ estimators


@ADVANTAGES.register("grpo", needs=("groups",))
def grpo(batch: AdvantageInputs, cfg: AdvantageConfig) -> AdvantageOutput:
    """GRPO outcome supervision (§4.1.2); cfg.scale_by_std=False gives Dr. GRPO."""
    a = group_normalize(batch.scores, batch.group_size, cfg.eps_adv, cfg.std_unbiased, cfg.scale_by_std)
    return AdvantageOutput(_broadcast(a, batch.mask), None)


@ADVANTAGES.register("dr_grpo", needs=("groups",))
def dr_grpo(batch: AdvantageInputs, cfg: AdvantageConfig) -> AdvantageOutput:
    """Dr. GRPO (§6): r_i - mean(r), no std scaling whatever cfg.scale_by_std says."""
    a = group_normalize(batch.scores, batch.group_size, scale=False)
    return AdvantageOutput(_broadcast(a, batch.mask), None)


def _checked_steps(batch: AdvantageInputs, i: int, T: int) -> tuple[Sequence[int], Sequence[float]]:
    """Response i's step end columns and step scores, validated."""
    ends, scores = batch.step_ends[i], batch.step_scores[i]
    if len(ends) != len(scores):
        raise ValueError(f"response {i}: {len(ends)} step ends but {len(scores)} step scores")
    for end in ends:
        if not 0 <= end < T:
            raise ValueError(f"response {i}: step end column {end} outside [0, {T})")
    return ends, scores


def _process_advantage(batch: AdvantageInputs, cfg: AdvantageConfig, what: str, step_values, credit) -> AdvantageOutput:
    """The shared frame of process supervision: per response, `step_values(scores)` gives one value per
    step; a group's values are pooled and normalised, v~ = (v - mean) / (std + eps_adv); `credit(adv_row,
    ends, normalised)` writes them onto the response's tokens. Masked tokens get 0; with
    cfg.outcome_weight = w > 0, w times the outcome GRPO advantage of `batch.scores` is added."""
    if batch.step_ends is None or batch.step_scores is None:
        raise ValueError(f"{what} needs step_ends and step_scores for every response")
    B, T = batch.mask.shape
    n_groups = check_group_size(B, batch.group_size)
    if len(batch.step_ends) != B or len(batch.step_scores) != B:
        raise ValueError(f"{what} needs step_ends/step_scores for all {B} responses")
    dtype = _float_dtype(batch.scores)
    adv = torch.zeros(B, T, dtype=dtype, device=batch.mask.device)
    G = batch.group_size
    for k in range(n_groups):
        rows = range(k * G, (k + 1) * G)
        steps = [_checked_steps(batch, i, T) for i in rows]
        values = [step_values([float(x) for x in scores]) for _, scores in steps]
        pooled = torch.tensor([v for vs in values for v in vs], dtype=dtype)
        if pooled.numel() == 0:
            continue
        mean = pooled.mean()
        std = pooled.std(correction=1 if cfg.std_unbiased else 0) if pooled.numel() > 1 else pooled.new_zeros(())
        flat = bool(pooled.max() == pooled.min())
        for i, (ends, _), vs in zip(rows, steps, values):
            credit(adv[i], ends, [0.0 if flat else float((v - mean) / (std + cfg.eps_adv)) for v in vs])
    adv = zero_masked(adv, batch.mask)
    if cfg.outcome_weight:
        adv = adv + cfg.outcome_weight * grpo(batch, cfg).adv.to(dtype)
    return AdvantageOutput(adv, None)


def _sum_credit(row: Tensor, ends: Sequence[int], normalised: Sequence[float]) -> None:
    """Token t gets the sum of the normalised values of the steps ending at or after t."""
    for end, v in zip(ends, normalised):
        row[: end + 1] += v


def _segment_credit(row: Tensor, ends: Sequence[int], normalised: Sequence[float]) -> None:
    """The tokens of step j (after step j-1's end, through step j's end) get step j's normalised value."""
    start = 0
    for end, v in zip(ends, normalised):
        row[start: end + 1] = v
        start = max(start, end + 1)


def suffix_min(values: Sequence[float]) -> list[float]:
    """[min(values[j:]) for each j]: the min-form return of every step."""
    out, low = [], float("inf")
    for v in reversed(values):
        low = min(low, v)
        out.append(low)
    return out[::-1]


@ADVANTAGES.register("grpo_process", needs=("groups", "step_scores"))
def grpo_process(batch: AdvantageInputs, cfg: AdvantageConfig) -> AdvantageOutput:
    """GRPO process supervision (§4.1.3), sum-form credit.

    All step rewards of a group are pooled and normalised,
    r~ = (r - mean(R)) / (std(R) + eps_adv); token t of response i gets
    A_t = sum of r~ over its steps whose end column is >= t. Tokens after the
    last step end get 0. With cfg.outcome_weight = w > 0, w times the outcome
    GRPO advantage of `batch.scores` is added to every token (process and outcome
    supervision together, as PRIME does); w = 0 (default) leaves `batch.scores` unused.
    """
    return _process_advantage(batch, cfg, "grpo_process", list, _sum_credit)


@ADVANTAGES.register("grpo_process_min", needs=("groups", "step_scores"))
def grpo_process_min(batch: AdvantageInputs, cfg: AdvantageConfig) -> AdvantageOutput:
    """GRPO process supervision with min-form credit (PURE, Cheng et al. 2025).

    The return of step j is the lowest step reward from j on, V_j = min_{k >= j} r_k, so one
    over-scored step cannot raise the credit of a solution whose later steps the PRM rejects.
    All V of a group are pooled and normalised, V~ = (V - mean) / (std + eps_adv); the tokens of
    step j (after step j-1's end, through step j's end) get V~_j. Tokens after the last step end
    get 0. cfg.outcome_weight adds the outcome GRPO advantage as in grpo_process.
    """
    return _process_advantage(batch, cfg, "grpo_process_min", suffix_min, _segment_credit)


@ADVANTAGES.register("rloo", needs=("groups", "kl_reward"))
def rloo(batch: AdvantageInputs, cfg: AdvantageConfig) -> AdvantageOutput:
    """RLOO (§8): R_i = score_i - beta * sum_t k_t;  A_i = R_i - mean_{j != i} R_j."""
    R = batch.scores.to(_float_dtype(batch.scores))
    kl = _kl_per_token(batch, cfg, "rloo")
    if kl is not None:
        R = R - cfg.kl_coef * masked_sum(kl, batch.mask, dim=-1)
    a = leave_one_out(R, batch.group_size)
    return AdvantageOutput(_broadcast(a, batch.mask), None)


def _global_normalize(x: Tensor, mask: Tensor, reduce: Reduce | None) -> Tensor:
    """OpenRLHF whitening: (x - mean) / sqrt(max(Var_pop, 1e-8)) over all valid tokens."""
    mean, var = masked_moments(x, mask, unbiased=False, reduce=reduce)
    var = var.clamp(min=1e-8)
    return zero_masked((x - mean) * torch.rsqrt(var), mask)


def _reinforce_pp(batch: AdvantageInputs, cfg: AdvantageConfig, scores: Tensor, what: str) -> AdvantageOutput:
    rewards = _token_rewards(batch, cfg, scores, what)
    zeros = torch.zeros_like(rewards)
    returns, _ = gae_recursion(rewards, zeros, batch.mask, cfg.gamma, 1.0)  # V = 0, lambda = 1: returns-to-go
    return AdvantageOutput(_global_normalize(returns, batch.mask, cfg.reduce), returns)


@ADVANTAGES.register("reinforce_pp", needs=("kl_reward",))
def reinforce_pp(batch: AdvantageInputs, cfg: AdvantageConfig) -> AdvantageOutput:
    """REINFORCE++ (§8): A_t = sum_{s>=t} gamma^(s-t) r_s with
    r_t = 1[t=T] score - beta k1_t, then global whitening (population variance)."""
    return _reinforce_pp(batch, cfg, batch.scores, "reinforce_pp")


@ADVANTAGES.register("reinforce_pp_baseline", needs=("groups", "kl_reward"))
def reinforce_pp_baseline(batch: AdvantageInputs, cfg: AdvantageConfig) -> AdvantageOutput:
    """REINFORCE++-baseline (§8): the group-mean score is subtracted first."""
    centred = group_normalize(batch.scores, batch.group_size, scale=False)
    return _reinforce_pp(batch, cfg, centred, "reinforce_pp_baseline")


@ADVANTAGES.register("gae", needs=("critic", "kl_reward"))
def gae(batch: AdvantageInputs, cfg: AdvantageConfig) -> AdvantageOutput:
    """PPO-RLHF (§3): r_t = -beta k1(old, ref)_t + 1[t=T] score; GAE(gamma, lam)
    with the rollout values; returns R = A + V are the critic targets;
    A is then whitened over the batch (cfg.whiten_advantages)."""
    if batch.values is None:
        raise ValueError("gae needs critic values for every token (AdvantageInputs.values)")
    rewards = _token_rewards(batch, cfg, batch.scores, "gae")
    if cfg.whiten_rewards:
        rewards = whiten(rewards, batch.mask, shift_mean=False, unbiased=cfg.whiten_unbiased, reduce=cfg.reduce)
    adv, returns = gae_recursion(rewards, batch.values, batch.mask, cfg.gamma, cfg.lam)
    if cfg.whiten_advantages:
        adv = whiten(adv, batch.mask, shift_mean=True, unbiased=cfg.whiten_unbiased, reduce=cfg.reduce)
    return AdvantageOutput(adv, returns)


@ADVANTAGES.register("rft")
def rft(batch: AdvantageInputs, cfg: AdvantageConfig) -> AdvantageOutput:
    """Online RFT (§5, Eq. 10): A = 1 if the response is correct (score >
    rft_threshold) else 0; with the `reinforce` policy loss GC = I(o)."""
    correct = (batch.scores > cfg.rft_threshold).to(_float_dtype(batch.scores))
    return AdvantageOutput(_broadcast(correct, batch.mask), None)


@ADVANTAGES.register("distill", needs=("teacher",))
def distill(batch: AdvantageInputs, cfg: AdvantageConfig) -> AdvantageOutput:
    """On-policy distillation (§16): A_t = distill_coef * (log pi_teacher(y_t) - log pi_old(y_t)), the negative of
    the per-token reverse KL's sampled estimate, so the policy gradient lowers KL(pi || pi_teacher) on the
    policy's own samples; plus outcome_weight x the grpo advantage (groups needed then). No discounting: each
    token is credited with its own term only. With distill_sampled False the teacher's signal is a divergence in
    the update's loss (rlft/algos/divergence.py) and the advantage is the outcome part alone."""
    if not cfg.distill_sampled:
        outcome = grpo(batch, cfg).adv if cfg.outcome_weight else torch.zeros_like(batch.mask, dtype=torch.float32)
        return AdvantageOutput(zero_masked(cfg.outcome_weight * outcome, batch.mask), None)
    if batch.teacher_logp is None or batch.old_logp is None:
        raise ValueError("distill needs the teacher's and pi_old's log-probs of the sampled tokens")
    dtype = torch.promote_types(_float_dtype(batch.teacher_logp), _float_dtype(batch.old_logp))
    adv = cfg.distill_coef * (batch.teacher_logp.to(dtype) - batch.old_logp.to(dtype))
    if cfg.outcome_weight:
        adv = adv + cfg.outcome_weight * grpo(batch, cfg).adv.to(dtype)
    return AdvantageOutput(zero_masked(adv, batch.mask), None)


__all__ = [
    "ADVANTAGES",
    "AdvantageConfig",
    "AdvantageInputs",
    "AdvantageOutput",
    "check_group_size",
    "dynamic_sampling_keep_mask",
    "frac_zero_std_groups",
    "group_normalize",
    "group_stats",
    "suffix_min",
    "leave_one_out",
    "zero_std_groups",
]
