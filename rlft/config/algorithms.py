"""Each training loop's `algo` schema, the sections only RL reads (critic, pairwise, iterative), and the
algorithm table that maps a preset's `algo.kind` to its loop."""
from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar, Optional

from rlft.config.fields import KLAt, KLIn, RewardSource, StepLabels, free_on_resume, read_when
from rlft.errors import ConfigError

@dataclass
class AlgoConfig:
    name: str = "???"
    """The preset's name (the `algo=` choice): the stage's directory under the run and its `stage:` name."""
    kind: str = "???"
    """The training loop (sft | rm | prm | dpo | rft | rl), fixed by the preset's schema."""
    init_from: str = "builtin:tiny"
    """Default `model.path` for this algorithm when model.path=auto."""


@dataclass
class SFTConfig(AlgoConfig):
    name: str = "sft"
    kind: str = "sft"
    init_from: str = "builtin:tiny"


@dataclass
class RewardDataConfig(AlgoConfig):
    """Where a reward model's training and held-out data come from."""
    source: RewardSource = RewardSource.data
    """data: the data's own rows (built-in task: the generator's correct vs corrupted solutions; a file: its
    pairs or step labels) | policy: samples of `algo.sample_from` on the data's questions, labelled by the
    answer verifier (RM and DPO pairs: a correct vs an incorrect sample of one question; PRM steps:
    `algo.labels`)."""
    sample_from: str = read_when("policy_source", "stage:sft")
    """source=policy: the model whose samples are labelled (rollout.samples_per_prompt per question)."""
    num_prompts: int = read_when("policy_source", 1000)
    """source=policy: training questions sampled (held-out: num_eval_pairs / num_eval_rows questions)."""


@dataclass
class RMConfig(RewardDataConfig):
    name: str = "rm"
    kind: str = "rm"
    init_from: str = "stage:sft"
    num_eval_pairs: int = 200
    """Held-out preference pairs for pairwise accuracy."""
    eval_every: int = free_on_resume(0)
    """Evaluate held-out accuracy every this many steps (0: only at the end)."""


@dataclass
class PRMConfig(RewardDataConfig):
    name: str = "prm"
    kind: str = "prm"
    init_from: str = "stage:sft"
    labels: StepLabels = read_when("policy_source", StepLabels.exact)
    """source=policy: exact (built-in task: each step checked against the worked solution) | mc (any
    question/answer data, Math-Shepherd: a step is good when one of mc_completions continuations of its
    prefix reaches the gold answer)."""
    mc_completions: int = read_when("policy_source", 4)
    """labels=mc: continuations sampled per step prefix (by algo.sample_from)."""
    good_step_weight: float = 1.0
    """Weight of good steps in the loss (BCE's pos_weight); e.g. the bad/good ratio of the labels (about 3.4
    for the built-in task's policy samples) balances the classes."""
    num_eval_rows: int = 200
    """Held-out step-labelled solutions for step accuracy."""
    frac_correct: float = 0.5
    """Built-in task: share of fully correct solutions among the step-labelled rows."""
    eval_every: int = free_on_resume(0)
    """Evaluate held-out accuracy every this many steps (0: only at the end)."""


@dataclass
class RLConfig(AlgoConfig):
    """Online RL (GRPO, PPO, P3O, online RFT/DPO, RLOO, ...): the loss pieces by name, KL, clipping and
    the update schedule. Sampling is under `rollout`, the value model under `critic`, pair losses
    under `pairwise`, reward-model retraining under `iterative`."""
    name: str = "grpo"
    kind: str = "rl"
    init_from: str = "stage:sft"
    advantage: str = read_when("per_token_update", "grpo")
    """Advantage estimator (`rlft list keys` shows the registered names): grpo | dr_grpo | grpo_process |
    grpo_process_min | rloo | reinforce_pp | reinforce_pp_baseline | rft | gae (gae trains a critic, see
    `critic.*`) | distill (a teacher scores every sampled token, see `teacher.*`)."""
    policy_loss: str = read_when("per_token_update", "ppo_clip")
    """Per-token policy loss: ppo_clip | gspo | reinforce."""
    pairwise_loss: Optional[str] = None
    """null: per-token update with algo.policy_loss. A name: pairwise update on disjoint pairs of completions
    of one prompt with that loss: p3o_joint | p3o_separate | p3o_separate_tokenwise | dpo (see `pairwise.*`)."""
    loss_agg: str = read_when("per_token_update", "seq-mean-token-mean")
    """Loss aggregation: seq-mean-token-mean | token-mean | seq-mean-token-sum | constant-norm."""
    clip_eps_low: float = read_when("loss_option", 0.2)
    """Clip range below 1 (PPO ratio; P3O's pair log-ratio)."""
    clip_eps_high: float = read_when("loss_option", 0.2)
    """PPO clip range above 1 (DAPO clip-higher: 0.28)."""
    dual_clip_c: Optional[float] = read_when("loss_option", None)
    """Dual-clip constant for negative advantages (null: off)."""
    kl_coef: float = 0.04
    """beta of the KL to the reference (0 loads no reference unless the pairwise loss needs one): per token in
    the loss (kl_in=loss), in the token rewards (kl_in=reward), or in P3O's pair reward difference."""
    kl_estimator: str = read_when("per_token_update", "k3")
    """KL estimator: k1 | k2 | k3 (GRPO: k3)."""
    kl_in: KLIn = read_when("per_token_update", KLIn.loss)
    """Where the per-token KL goes: loss (GRPO) | reward (PPO, folded into the token rewards)."""
    adaptive_kl: bool = False
    """Adapt kl_coef towards kl_target (Ziegler et al. 2019)."""
    kl_target: float = read_when("adaptive_kl", 6.0)
    """Adaptive KL: target sequence KL."""
    kl_horizon: int = read_when("adaptive_kl", 10000)
    """Adaptive KL: horizon in samples."""
    scale_by_std: bool = read_when("per_token_update", True)
    """Group advantages: divide group-centred rewards by the group std (False: Dr. GRPO)."""
    std_unbiased: bool = read_when("per_token_update", True)
    """Group advantages: unbiased (n-1) std."""
    eps_adv: float = read_when("per_token_update", 1.0e-4)
    """Group advantages: added to the group std."""
    rft_threshold: float = read_when("per_token_update", 0.5)
    """rft advantage: a completion counts as correct when its reward exceeds this."""
    outcome_weight: float = read_when("outcome_weight", 0.0)
    """grpo_process(_min), distill: weight of the outcome reward's GRPO advantage added to every token of a
    completion (0: process supervision or distillation alone; > 0: together with outcome supervision)."""
    distill_coef: float = read_when("teacher", 1.0)
    """distill: weight of the per-token teacher signal, log pi_teacher - log pi_old of each sampled token
    (the negative reverse KL's sampled estimate, docs/algorithms.md), or of the divergence below."""
    distill_divergence: str = read_when("teacher", "sampled")
    """distill: the teacher signal: sampled (the advantage above, from the sampled token) | forward_kl |
    reverse_kl | jsd (a divergence of the whole next-token distributions at every position of the student's
    samples, distill_coef x it added to each token's loss; the teacher runs in the update's forwards)."""
    distill_beta: float = read_when("jsd", 0.5)
    """distill_divergence=jsd: beta of the generalised JSD (0 < beta < 1; towards forward KL as it falls)."""
    distill_top_k: int = read_when("divergence", 0)
    """A full-distribution divergence over the teacher's top-k tokens and one bucket for the rest (0: the whole
    vocabulary)."""
    updates_per_rollout: int = 1
    """mu: passes over each rollout batch (GRPO Algorithm 1)."""
    minibatches_per_rollout: int = 1
    """Optimizer steps per pass over a rollout batch."""
    shuffle_minibatches: bool = False
    """Reshuffle this rank's prompts (whole groups) before each pass, so the minibatches differ from
    pass to pass (PPO's default; off keeps each minibatch's prompts independent of the rank count)."""
    eval_every: int = free_on_resume(0)
    """Held-out greedy accuracy every this many optimizer steps (0: only at the end)."""
    eval_problems: int = free_on_resume(200)
    """Held-out problems for the in-training accuracy."""


@dataclass
class CriticConfig:
    """The value model of an advantage that needs one (gae: PPO) and its GAE."""
    READ_WHEN: ClassVar[str] = "critic"
    init: str = "stage:rm"
    """The model the value head starts from (stage:rm, stage:sft, a directory)."""
    lr: Optional[float] = None
    """Critic learning rate (null: the defaults table)."""
    value_clip: float = 0.2
    """Value clipping range around the rollout values."""
    gamma: float = 1.0
    """GAE discount."""
    lam: float = 0.95
    """GAE lambda."""
    whiten_advantages: bool = True
    """Whiten GAE advantages over the whole rollout (every rank's share)."""
    whiten_rewards: bool = False
    """Whiten the token rewards (scale only, mean kept) before GAE, over the whole rollout."""
    whiten_unbiased: bool = True
    """Whitening's variance with Bessel's correction (TRL, verl); false: population variance (lm-human-preferences)."""


@dataclass
class TeacherConfig:
    """The model an advantage that needs one (distill: on-policy distillation) scores the sampled tokens with."""
    READ_WHEN: ClassVar[str] = "teacher"
    path: str = ""
    """Anything model.path takes (stage:<algo>, a folder, a hub id, a GGUF file, an adapter folder); its tokenizer
    must be the student's."""


@dataclass
class PairwiseConfig:
    """Options of the pairwise losses (algo.pairwise_loss); each is read by the losses that declare it among
    their options when they register (rlft/algos/pairwise.py), and refused when set for another."""
    READ_WHEN: ClassVar[str] = "loss_option"
    c: float = 10.0
    """P3O: importance weights clipped to [1/c, c]."""
    kl_at: KLAt = KLAt.old
    """P3O: sequence KL in the reward difference from the rollout policy (old) or the current one (current)."""
    avg_tokenwise: bool = False
    """P3O joint/separate: divide by the tokens of both responses instead of the pairs (the authors' option)."""
    beta: float = 0.1
    """Online DPO: DPO's beta (the strength of the implicit KL to the reference)."""
    length_normalize: bool = False
    """Online DPO: length-normalised log-ratios (DeepSeekMath Eq. 12)."""


@dataclass
class IterativeConfig:
    """Iterative RL (DeepSeekMath §4.1.4): after each iteration the reward models retrain on policy samples."""
    iterations: int = 1
    """Iterations; after each but the last, the RM/PRM retrain on policy samples and the reference resets."""
    replay_ratio: float = read_when("iterative", 0.1)
    """Share of the reward model's earlier training data in its retraining mix."""
    rm_steps: int = read_when("iterative", 40)
    """Reward-model optimizer steps after each iteration."""
    rm_lr: Optional[float] = read_when("iterative", None)
    """Reward-model learning rate (null: the defaults table)."""
    reset_reference: bool = read_when("iterative", True)
    """After each iteration the KL reference becomes the current policy (DeepSeekMath's Algorithm 1);
    false keeps the starting model as the reference throughout."""
    step_labels: StepLabels = read_when("iterative", StepLabels.mc)
    """PRM: how each step of the new samples is labelled: mc (Math-Shepherd: a step is good when one of
    label_completions continuations of its prefix, sampled from the current policy, reaches the gold answer;
    any question/answer data) | exact (built-in task: each step checked against the worked solution)."""
    label_completions: int = read_when("iterative_mc_labels", 4)
    """PRM, step_labels=mc: continuations sampled per step prefix."""
    label_budget: int = read_when("iterative", 64)
    """PRM: incorrect completions labelled step by step per iteration and rank (and as many correct ones)."""


@dataclass
class RFTConfig(AlgoConfig):
    """Offline rejection-sampling fine-tuning: sample once from the SFT model, keep correct, fine-tune."""
    name: str = "rft"
    kind: str = "rft"
    init_from: str = "stage:sft"
    num_prompts: int = 1000
    """Training prompts sampled from (0: all)."""
    rft_threshold: float = 0.5
    """A completion is kept when its reward exceeds this."""


@dataclass
class DPOConfig(RewardDataConfig):
    """Offline DPO on preference pairs against the frozen starting model: the data's pairs, or
    (source=policy) pairs of the starting model's own samples, a correct one chosen over an incorrect one."""
    name: str = "dpo"
    kind: str = "dpo"
    init_from: str = "stage:sft"
    beta: float = 0.1
    """Strength of the implicit KL constraint (DPO's beta)."""
    length_normalize: bool = False
    """Divide each log-ratio by the response length (DeepSeekMath Eq. 12)."""
    num_eval_pairs: int = 200
    """Held-out preference pairs for the implicit-reward accuracy."""
    eval_every: int = free_on_resume(0)
    """Evaluate held-out pairs every this many steps (0: only at the end)."""


@dataclass(frozen=True)
class AlgoSpec:
    """One training loop. A preset (`conf/algo/<name>.yaml`) picks a loop through its schema
    (`algo.kind`) and names registered functions (advantage, losses); everything that depends on the
    algorithm asks this table or those registries, never the preset's name."""
    schema: type
    """Its config schema (the `algo` section)."""
    stage: str
    """`module:function` in rlft.stages that trains it: function(cfg, ctx) -> summary."""
    rl: bool = False
    """The online RL loop: rollouts from the policy, batch derived from prompts x samples."""
    samples: bool = False
    """Samples completions and scores them with `reward.functions`."""
    rows: str = "qa"
    """The data rows it reads: qa (question/answer), preference (prompt/chosen/rejected), steps (step labels)."""
    demonstrations: bool = False
    """Trains on the environment's demonstrations (prompt + response within train.max_seq_len)."""


ALGOS: dict[str, AlgoSpec] = {
    "sft": AlgoSpec(SFTConfig, "sft:run", demonstrations=True),
    "rm": AlgoSpec(RMConfig, "reward:run_rm", rows="preference"),
    "prm": AlgoSpec(PRMConfig, "reward:run_prm", rows="steps"),
    "dpo": AlgoSpec(DPOConfig, "dpo:run", rows="preference"),
    "rft": AlgoSpec(RFTConfig, "rft:run", samples=True),
    "rl": AlgoSpec(RLConfig, "rl:run", rl=True, samples=True),
}
ALGO_SCHEMAS: dict[str, type] = {kind: spec.schema for kind, spec in ALGOS.items()}


def algo_spec(algo) -> AlgoSpec:
    """The table's entry for an `algo` section (its `kind`); a one-line ConfigError otherwise."""
    kind = algo.kind
    if kind not in ALGOS:
        raise ConfigError(f"algo.kind={kind!r} is not a training loop; valid: {', '.join(ALGOS)} "
                          "(set by the preset's schema: `defaults: [/algo_schema/<kind>@algo]`)")
    return ALGOS[kind]
