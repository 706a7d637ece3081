"""Pure tensor functions for every rlft algorithm (maths: docs/algorithms.md).

The training loop picks each piece by name from a registry whose entries share
one signature, so it never branches on the algorithm:

    ADVANTAGES      fn(batch: AdvantageInputs, cfg: AdvantageConfig) -> AdvantageOutput(adv, returns)
    POLICY_LOSSES   fn(logp, old_logp, adv, mask, cfg: PolicyLossConfig) -> (loss [B, T], metrics)
    PAIRWISE_LOSSES fn(batch: PairBatch, cfg: PairLossConfig, counts: PairCounts) -> (loss, {name: (sum, count)})
    KL_ESTIMATORS   fn(logp, ref_logp) -> Tensor (elementwise)
    IS_CORRECTIONS  fn(old_logp, engine_logp, mask, cfg: ISConfig) -> (weights [B, T], metrics)
    AGGREGATIONS    fn(loss [B, T], mask [B, T], denom: AggDenominator | None) -> scalar

One GRPO-style step, for example:

    out = ADVANTAGES.get(cfg.adv.estimator)(AdvantageInputs(scores, mask, group_size=G), cfg.adv)
    loss, metrics = POLICY_LOSSES.get(cfg.policy_loss)(logp, old_logp, out.adv, mask, cfg.pl)
    loss = loss + beta * KL_ESTIMATORS.get("k3")(logp, ref_logp)
    scalar = AGGREGATIONS.get(cfg.loss_agg)(loss, mask, denom)   # denom: counts of the whole step
"""

from rlft.algos.advantages import (
    ADVANTAGES,
    AdvantageConfig,
    AdvantageInputs,
    AdvantageOutput,
    check_group_size,
    dynamic_sampling_keep_mask,
    frac_zero_std_groups,
    group_normalize,
    group_stats,
    suffix_min,
    leave_one_out,
)
from rlft.algos.aggregate import AGGREGATIONS, AggDenominator, agg_denominator, aggregate
from rlft.algos.importance import IS_CORRECTIONS, ISConfig
from rlft.algos.kl import KL_ESTIMATORS, AdaptiveKLController
from rlft.algos.masked import masked_mean, masked_sum, masked_var, sequence_logp, whiten, zero_masked
from rlft.algos.pairwise import (
    PAIRWISE_LOSSES,
    PairBatch,
    PairCounts,
    PairLossConfig,
    as_pairs,
    online_dpo_pair_loss,
    p3o_aggregate,
    p3o_joint,
    p3o_pair_indices,
    p3o_reward_delta,
    p3o_separate,
    p3o_separate_tokenwise,
    pair_rollout_inputs,
)
from rlft.algos.policy_losses import POLICY_LOSSES, PolicyLossConfig, importance_ratio
from rlft.algos.preference import (
    bradley_terry_loss,
    dpo_loss,
    math_shepherd_labels,
    prm_bce_loss,
    solution_score_min,
)
from rlft.algos.value import explained_variance, gae, kl_shaped_rewards, score_at_last_token, value_loss

__all__ = [
    "ADVANTAGES",
    "AGGREGATIONS",
    "IS_CORRECTIONS",
    "ISConfig",
    "KL_ESTIMATORS",
    "PAIRWISE_LOSSES",
    "POLICY_LOSSES",
    "AdaptiveKLController",
    "AdvantageConfig",
    "AdvantageInputs",
    "AdvantageOutput",
    "AggDenominator",
    "PairBatch",
    "PairCounts",
    "PairLossConfig",
    "PolicyLossConfig",
    "agg_denominator",
    "aggregate",
    "bradley_terry_loss",
    "check_group_size",
    "dpo_loss",
    "dynamic_sampling_keep_mask",
    "explained_variance",
    "frac_zero_std_groups",
    "gae",
    "group_normalize",
    "group_stats",
    "suffix_min",
    "importance_ratio",
    "kl_shaped_rewards",
    "leave_one_out",
    "masked_mean",
    "masked_sum",
    "masked_var",
    "math_shepherd_labels",
    "as_pairs",
    "online_dpo_pair_loss",
    "p3o_aggregate",
    "p3o_joint",
    "p3o_pair_indices",
    "p3o_reward_delta",
    "p3o_separate",
    "p3o_separate_tokenwise",
    "pair_rollout_inputs",
    "prm_bce_loss",
    "score_at_last_token",
    "sequence_logp",
    "solution_score_min",
    "value_loss",
    "whiten",
    "zero_masked",
]
