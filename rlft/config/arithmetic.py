"""Values that follow from others: whether a run trains a critic or loads a reference, the samples an
optimizer step consumes, the steps a sample budget buys, the RL batch, gradient accumulation."""
from __future__ import annotations

import math

from rlft.config.algorithms import algo_spec
from rlft.errors import ConfigError


def advantage_needs(cfg, what: str) -> bool:
    """Whether this run's advantage estimator declares `what` among its needs: an RL run with a per-token update
    (a pairwise loss reads no estimator)."""
    from rlft.algos import ADVANTAGES

    return algo_spec(cfg.algo).rl and cfg.algo.pairwise_loss is None and ADVANTAGES.needs(cfg.algo.advantage, what)


def trains_critic(cfg) -> bool:
    """Whether this run trains a value model: an RL run whose advantage estimator needs one."""
    return advantage_needs(cfg, "critic")


def uses_teacher(cfg) -> bool:
    """Whether this run scores its samples with a teacher: an RL run whose advantage estimator reads one."""
    return advantage_needs(cfg, "teacher")


def distill_sampled(algo) -> bool:
    """Whether a teacher's signal is the sampled-token advantage (algo.distill_divergence=sampled), else a
    full-distribution divergence in the update's loss."""
    return str(getattr(algo, "distill_divergence", "sampled")) == "sampled"


def needs_reference(cfg) -> bool:
    """An RL run loads the reference model when a KL term reads it or the pairwise loss does."""
    from rlft.algos import PAIRWISE_LOSSES

    algo = cfg.algo
    return algo.kl_coef > 0 or (algo.pairwise_loss is not None and PAIRWISE_LOSSES.needs(algo.pairwise_loss,
                                                                                         "reference"))


def sequences_per_example(algo) -> int:
    """Sequences in one training example of the loop: 2 for preference pairs, else 1."""
    return 2 if algo_spec(algo).rows == "preference" else 1


def samples_per_step(cfg) -> float:
    """Training samples one optimizer step consumes (train.max_samples' unit): an RL step its share of a
    rollout's completions, a supervised step its batch's sequences."""
    if algo_spec(cfg.algo).rl:
        algo, rollout = cfg.algo, cfg.rollout
        optimizer_steps = algo.updates_per_rollout * algo.minibatches_per_rollout
        return rollout.prompts_per_step * rollout.samples_per_prompt / optimizer_steps
    return cfg.train.batch_size * sequences_per_example(cfg.algo)


def steps_for_budget(cfg, max_samples: int) -> int:
    """The fewest optimizer steps whose samples reach max_samples: whole rollouts and, for iterative RL,
    the same number of rollouts in every iteration."""
    if not algo_spec(cfg.algo).rl:
        return math.ceil(max_samples / samples_per_step(cfg))
    algo, rollout = cfg.algo, cfg.rollout
    per_rollout = rollout.prompts_per_step * rollout.samples_per_prompt
    rollouts = math.ceil(max_samples / per_rollout)
    iterations = max(int(cfg.iterative.iterations), 1)
    rollouts = math.ceil(rollouts / iterations) * iterations
    return rollouts * algo.updates_per_rollout * algo.minibatches_per_rollout


def derive(cfg) -> None:
    """Fill values that follow from others: an RL optimizer step's batch is its rollout share; a sample
    budget (train.max_samples) sets train.max_steps. (Rates and sizes the config leaves null were filled by
    the defaults table first: rlft/config/defaults.py.)"""
    if algo_spec(cfg.algo).rl:
        algo, rollout = cfg.algo, cfg.rollout
        rollout_size = rollout.prompts_per_step * rollout.samples_per_prompt
        if rollout_size % algo.minibatches_per_rollout:
            raise ConfigError(f"rollout.prompts_per_step x rollout.samples_per_prompt = {rollout_size} is not "
                              f"divisible by algo.minibatches_per_rollout={algo.minibatches_per_rollout}")
        batch, given = rollout_size // algo.minibatches_per_rollout, cfg.train.batch_size
        if given is not None and given != batch:  # set by the user, and RL would replace it
            raise ConfigError(f"train.batch_size={given} is not read by RL: an optimizer step trains on its share of "
                              f"the rollout, rollout.prompts_per_step x rollout.samples_per_prompt / "
                              f"algo.minibatches_per_rollout = {batch} sequences; set those instead")
        cfg.train.batch_size = batch
    if cfg.train.max_samples < 0:
        raise ConfigError(f"train.max_samples={cfg.train.max_samples} must be >= 0 (0: train.max_steps decides)")
    if cfg.train.max_samples:
        cfg.train.max_steps = steps_for_budget(cfg, int(cfg.train.max_samples))


def grad_accum_steps(cfg) -> int:
    world = cfg.deepspeed.nproc_per_node * cfg.deepspeed.nnodes
    return cfg.train.batch_size // (cfg.train.micro_batch_per_device * world)
