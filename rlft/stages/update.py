"""The update step of online RL: optimizer steps on one prepared rollout (rlft.stages.experience).

    policy    mu passes (`algo.updates_per_rollout`) of `algo.minibatches_per_rollout` optimizer steps:
              the registered per-token policy loss (+ kl_coef x KL to the reference when algo.kl_in=loss),
              or, with `algo.pairwise_loss`, a PAIRWISE_LOSSES entry on pairs of completions
    critic    the same optimizer steps of the value loss (PPO), after the policy's

Every micro-batch loss is normalised by the counts of its whole minibatch on all ranks, so an update
does not depend on micro-batch size, gradient accumulation or world size (docs/algorithms.md §1).
The critic reads only the rollout (its values and returns at sampling time), so stepping it after the
policy rather than between the policy's micro-batches changes nothing.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch

from rlft import dist
from rlft.algos import (AGGREGATIONS, KL_ESTIMATORS, PAIRWISE_LOSSES, POLICY_LOSSES, AggDenominator, PairBatch,
                        PairCounts, PairLossConfig, PolicyLossConfig)
from rlft.algos.value import value_loss
from rlft.config.arithmetic import distill_sampled
from rlft.microbatch import rollout_groups
from rlft.models import token_scores
from rlft.rollout import batch as rb
from rlft.rollout.lm_head import TeacherTerm, TokenLoss
from rlft.rollout.logprobs import packed_logp, padding_fraction, response_start, token_logp
from rlft.stages.common import Sums


@dataclass(frozen=True)
class Shape:
    """How the update walks a rollout: the algorithm's passes and minibatches, its groups, and how each
    optimizer step is cut into forwards (`micro` rows or the token budget `max_tokens`; `packed`:
    padding-free forwards)."""
    algo: object  # cfg.algo: losses, clip ranges, updates_per_rollout, minibatches_per_rollout, shuffle
    group_size: int
    temperature: float
    max_new_tokens: int
    micro: int
    max_tokens: int = 0
    packed: bool = False
    share_prompt: bool = False  # each distinct prompt of a forward runs once (train.share_prompt)
    top_k: int = 0  # the sampler's truncation, replayed on the log-probs (lm_head.truncate)
    top_p: float = 1.0
    liger: bool = False  # the per-token loss through liger-kernel's fused linear loss (train.fused_loss=liger)

    @classmethod
    def of(cls, cfg) -> "Shape":
        train, rollout = cfg.train, cfg.rollout
        return cls(cfg.algo, rollout.samples_per_prompt, rollout.temperature, rollout.max_new_tokens,
                   train.micro_batch_per_device, train.max_tokens_per_micro_batch, train.packing,
                   bool(train.share_prompt), int(rollout.top_k), float(rollout.top_p),
                   str(train.fused_loss) == "liger")


class Update:
    """The update step of one rank: the policy's optimizer steps (per-token or pairwise), then the critic's."""

    def __init__(self, cfg, policy, critic=None, teacher=None):
        self.cfg, self.policy, self.critic = cfg, policy, critic
        self.shape = Shape.of(cfg)
        algo = cfg.algo
        self.term = None  # a full-distribution distillation divergence (algo.distill_divergence), else None
        if teacher is not None and not distill_sampled(algo):
            self.term = TeacherTerm(teacher, str(algo.distill_divergence), float(algo.distill_beta),
                                    int(algo.distill_top_k))

    def __call__(self, ro: rb.Rollout, stats: Sums, rollout_index: int, kl_coef: float) -> None:
        seed = (self.cfg.seed * 1_000_003 + rollout_index) * 4099 + dist.info().rank  # minibatch shuffles
        if self.cfg.algo.pairwise_loss is not None:
            update_pairwise(self.policy, ro, stats, self.shape, self.cfg.pairwise, kl_coef, seed)
        else:
            update_policy(self.policy, ro, stats, self.shape, kl_coef, seed, self.term)
        if self.critic is not None:
            update_critic(self.critic, ro, stats, self.shape, self.cfg.critic.value_clip, seed)


def micro_inputs(ro: rb.Rollout, rows, device) -> tuple:
    """One micro-batch of the rollout (rows: a slice or row indices) trimmed to its longest row:
    (ids, attention mask, cols, response mask). `cols` are the target columns from its first response
    token on and select those columns from any [N, L-1] rollout tensor (old/ref log-probs, advantages,
    values)."""
    width = int(ro.attention_mask[rows].sum(-1).max())
    ids, attn = ro.input_ids[rows, :width].to(device), ro.attention_mask[rows, :width].to(device)
    cols = slice(response_start(ro.mask[rows, :width - 1]), width - 1)
    return ids, attn, cols, ro.mask[rows, cols].to(device)


def micro_forward(policy, ro: rb.Rollout, rows, temperature: float, packed: bool = False, share_prompt: bool = False,
                  top_k: int = 0, top_p: float = 1.0, term: TeacherTerm | None = None,
                  loss: Callable[[torch.Tensor], TokenLoss] | None = None):
    """One micro-batch through the policy (with grad): (ids, attention mask, cols, response mask, token
    entropy (no grad), per-token log-probs), as `micro_inputs`. `packed`: one padding-free forward
    (train.packing); `share_prompt`: each distinct prompt once (train.share_prompt); the same values.
    `temperature`, `top_k`, `top_p`: the distribution the tokens were sampled from. With a teacher `term`, a
    seventh value: the per-token divergence from the teacher (with grad). With `loss` (the micro-batch's
    target-aligned mask [B, L-1] -> its lm_head.TokenLoss), a last value: that loss with grad, its head
    gradients computed in the forward; the log-probs and the divergence are then without grad."""
    ids, attn, cols, mask = micro_inputs(ro, rows, policy.device)
    full_mask = ro.mask[rows, :ids.shape[1] - 1].to(policy.device)
    token_loss = loss(full_mask) if loss is not None else None
    if packed:
        got = packed_logp(policy, ids, attn, full_mask, temperature, ("entropy",), top_k, top_p, term, token_loss)
    else:
        got = token_logp(policy, ids, attn, temperature, cols.start,
                         rb.prompt_lens_of(ro, rows) if share_prompt else None, full_mask, ("entropy",),
                         top_k, top_p, term, token_loss)
    logp, extra = got[:2]
    out = ids, attn, cols, mask, extra["entropy"][:, cols], logp[:, cols]
    out = out + (extra["divergence"][:, cols],) if term is not None else out
    return out + (got[2],) if loss is not None else out


def epoch_rollout(ro: rb.Rollout, algo, group_size: int, epoch: int, shuffle_seed: int | None) -> rb.Rollout:
    """The rollout as pass `epoch` sees it: with algo.shuffle_minibatches, this rank's groups in a
    fresh seeded order, so each pass cuts different minibatches."""
    if shuffle_seed is None or not algo.shuffle_minibatches:
        return ro
    return rb.take(ro, rb.group_shuffle_order(len(ro), group_size, shuffle_seed * 101 + epoch))


def optimizer_steps(rollout: rb.Rollout, algo, group_size: int, shuffle_seed: int | None):
    """(the rollout as this pass orders it, first row, rows) of each optimizer step: mu passes
    (`algo.updates_per_rollout`) of `algo.minibatches_per_rollout` steps each."""
    n = len(rollout)
    per_mb = n // algo.minibatches_per_rollout
    for epoch in range(algo.updates_per_rollout):
        ro = epoch_rollout(rollout, algo, group_size, epoch, shuffle_seed)
        for start in range(0, n, per_mb):
            yield ro, start, per_mb


def step_loop(engine, rollout: rb.Rollout, shape: Shape, shuffle_seed: int | None, begin_step: Callable,
              micro_loss: Callable, stats: Sums | None = None, unit: int = 1) -> None:
    """The optimizer-step skeleton every update shares: for each optimizer step (`optimizer_steps`),
    `begin_step(ro, start, per_mb)` gives that step's minibatch-wide inputs, the step is cut into
    forwards (`rollout_groups`, `unit` rows kept together), and each forward's
    `micro_loss(ro, rows, step_inputs)` is backpropagated; the engine steps at the last one.
    `stats`: where the forwards per optimizer step are counted (the policy's update counts them)."""
    for ro, start, per_mb in optimizer_steps(rollout, shape.algo, shape.group_size, shuffle_seed):
        step_inputs = begin_step(ro, start, per_mb)
        groups = rollout_groups(ro.attention_mask, start, per_mb, shape.micro, shape.max_tokens, shape.packed,
                                unit=unit)
        if stats is not None:
            stats.add("micro_batches", len(groups), 1)  # forwards per rank in this optimizer step
        for k, rows in enumerate(groups):
            engine.backward(micro_loss(ro, rows, step_inputs), last=k == len(groups) - 1)
            engine.step()


def token_denominator(shape: Shape) -> Callable:
    """step_loop's `begin_step` for a per-token loss: the minibatch's global token denominator."""
    return lambda ro, start, per_mb: global_denominator(ro.mask[start:start + per_mb], shape.max_new_tokens)


def update_policy(policy, ro: rb.Rollout, stats: Sums, shape: Shape, kl_coef: float,
                  shuffle_seed: int | None = None, term: TeacherTerm | None = None) -> None:
    """The policy's optimizer steps with the registered per-token loss. With the rollout's is_weight (the
    engine-mismatch correction) each token's policy loss is reweighted before the KL term is added;
    the KL to the reference is measured whenever the rollout has reference log-probs and enters the
    loss with algo.kl_in=loss; with a teacher `term`, algo.distill_coef x the divergence from the teacher is
    added to each token's loss (logged as distill_divergence). Every metric the loss returns is logged (a
    masked mean over tokens).

    A loss registered `per_token` (each token's term from its own log-prob) goes to the LM head as a TokenLoss,
    each token's term weighted by its share in the aggregation (`aggregation_weights`), and is differentiated
    chunk by chunk in the forward (lm_head.head_loss), or with `shape.liger` by liger-kernel's fused loss of the
    same sum (rollout/liger.py: ppo_clip and the k3 KL); another (gspo) is computed from the log-probs."""
    algo, dev = shape.algo, policy.device
    policy_loss = POLICY_LOSSES.get(algo.policy_loss)
    aggregate = AGGREGATIONS.get(algo.loss_agg)
    kl_fn = KL_ESTIMATORS.get(algo.kl_estimator)
    meta = POLICY_LOSSES.meta(algo.policy_loss)
    pl_cfg = PolicyLossConfig(**{key: getattr(algo, key) for key in meta.get("options", ())})

    def token_terms(logp, old, adv, mask, ref, is_weight, divergence):
        """(each token's loss before aggregation, the policy loss's metrics)."""
        loss_tok, metrics = policy_loss(logp, old, adv, mask, pl_cfg)
        if is_weight is not None:
            loss_tok = loss_tok * is_weight
        if ref is not None and algo.kl_in == "loss":
            loss_tok = loss_tok + kl_coef * kl_fn(logp, ref)
        if divergence is not None:
            loss_tok = loss_tok + algo.distill_coef * divergence
        return loss_tok, metrics

    def fused_terms(logp, t, divergence):  # lm_head.TokenLoss.fn: a chunk of tokens, each weighted
        return token_terms(logp, t.get("old"), t["adv"], torch.ones_like(logp), t.get("ref"), t.get("is_weight"),
                           divergence)[0] * t["weight"]

    kernel = None  # liger's fused loss, built once for the update (its KL only where the loss has one)
    if shape.liger:
        kernel = liger_loss(policy, shape, kl_coef if ro.get("ref_logp") is not None and algo.kl_in == "loss" else 0.0)

    def micro_loss(ro, rows, denom):  # ro: the rollout as this pass orders it (rows index it)
        adv = ro.need("adv", f"policy loss {algo.policy_loss}")
        tensors = {"adv": adv, "old": ro.get("old_logp"), "ref": ro.get("ref_logp"), "is_weight": ro.get("is_weight")}

        def token_loss(full_mask):  # this micro-batch's TokenLoss on its [B, L-1] columns
            width = full_mask.shape[1]
            inputs = {name: x[rows, :width].to(dev) for name, x in tensors.items() if x is not None}
            inputs["weight"] = aggregation_weights(aggregate, full_mask, denom)
            return TokenLoss(fused_terms, inputs, kernel)
        ids, attn, cols, mask, ent, logp, *rest = micro_forward(
            policy, ro, rows, shape.temperature, shape.packed, shape.share_prompt, shape.top_k, shape.top_p, term,
            token_loss if meta.get("per_token") else None)
        add_padding(stats, attn, shape.packed)
        old, ref, is_weight = (tensors[name][rows, cols].to(dev) if tensors[name] is not None else None
                               for name in ("old", "ref", "is_weight"))
        divergence = rest[0] if term is not None else None
        if meta.get("per_token"):
            loss = rest[-1]
            with torch.no_grad():
                metrics = policy_loss(logp, old, adv[rows, cols].to(dev), mask, pl_cfg)[1]
        else:
            loss_tok, metrics = token_terms(logp, old, adv[rows, cols].to(dev), mask, ref, is_weight, divergence)
            loss = aggregate(loss_tok, mask, denom)
        tokens = mask.sum().item()
        if ref is not None:
            stats.add("kl", masked_sum_f(kl_fn(logp.detach(), ref), mask), tokens)
        if divergence is not None:
            stats.add("distill_divergence", masked_sum_f(divergence.detach(), mask), tokens)
        values = torch.stack([v.detach().to(torch.float64) for v in metrics.values()]).tolist()  # one sync
        for name, value in zip(metrics, values):  # each a masked mean over the micro-batch's tokens
            stats.add(name, value * tokens, tokens)
        stats.add("entropy", masked_sum_f(ent, mask), tokens)
        return loss

    step_loop(policy, ro, shape, shuffle_seed, token_denominator(shape), micro_loss, stats)


def liger_loss(policy, shape: Shape, kl_coef: float) -> Callable:
    """liger-kernel's fused ppo_clip + k3 KL loss with the update's settings (TokenLoss.kernel)."""
    from rlft.rollout.lm_head import chunk_tokens_of
    from rlft.rollout.liger import policy_kernel

    algo = shape.algo
    return policy_kernel(float(algo.clip_eps_low), float(algo.clip_eps_high), float(kl_coef), shape.temperature,
                         chunk_tokens_of(policy))


def aggregation_weights(aggregate: Callable, mask: torch.Tensor, denom: AggDenominator) -> torch.Tensor:
    """Each token's weight in an AGGREGATIONS entry's scalar ([B, T] like `mask`): every aggregation is linear in
    the per-token loss, so its gradient there is the weight (1 / N_tok for token-mean, 1 / (N_seq |o_i|) for
    seq-mean-token-mean, ...)."""
    with torch.enable_grad():
        probe = torch.zeros_like(mask, dtype=torch.float32, requires_grad=True)
        return torch.autograd.grad(aggregate(probe, mask, denom), probe)[0]


def update_critic(critic, ro: rb.Rollout, stats: Sums, shape: Shape, value_clip: float,
                  shuffle_seed: int | None = None) -> None:
    """The critic's optimizer steps (clipped value loss on the rollout's returns), over the same
    minibatches and forwards as the policy's."""
    dev = critic.device

    def micro_loss(ro, rows, denom):
        old_values, returns = ro.need("values", "the value loss"), ro.need("returns", "the value loss")
        ids, attn, cols, mask = micro_inputs(ro, rows, dev)
        tokens = mask.sum().item()
        values = token_scores(critic.module, ids, attn)[:, :-1][:, cols.start:]
        vloss, vm = value_loss(values, old_values[rows, cols].to(dev), returns[rows, cols].to(dev), mask,
                               value_clip, denom)
        stats.add("value_loss", vloss.item() * denom.num_tokens, tokens)
        stats.add("vf_explained_var", vm["vf_explained_var"].item() * tokens, tokens)
        stats.add("vf_clipfrac", vm["vf_clipfrac"].item() * tokens, tokens)
        return vloss

    step_loop(critic, ro, shape, shuffle_seed, token_denominator(shape), micro_loss)


def update_pairwise(policy, ro: rb.Rollout, stats: Sums, shape: Shape, pairwise, kl_coef: float,
                    shuffle_seed: int | None = None) -> None:
    """Pairwise updates on rows (2j, 2j+1) with the PAIRWISE_LOSSES entry `algo.pairwise_loss`
    (P3O §10, online DPO §9); each micro-batch's loss is normalised by its optimizer step's counts."""
    algo, dev = shape.algo, policy.device
    loss_fn = PAIRWISE_LOSSES.get(algo.pairwise_loss)
    cfg = PairLossConfig(eps=algo.clip_eps_low, c=pairwise.c, kl_coef=kl_coef, kl_at=str(pairwise.kl_at),
                         avg_tokenwise=pairwise.avg_tokenwise, beta=pairwise.beta,
                         length_normalize=pairwise.length_normalize)
    reader = f"pairwise loss {algo.pairwise_loss}"

    def begin_step(ro, start, per_mb):
        m, scores = ro.mask[start:start + per_mb], ro.need("pair_scores", reader)
        untied = float((scores[start // 2:(start + per_mb) // 2].diff(dim=-1) != 0).sum())
        pairs, tokens, untied = dist.all_reduce_sum([m.shape[0] / 2.0, float(m.sum()), untied])
        return PairCounts(pairs=pairs, tokens=tokens, untied=untied)

    def micro_loss(ro, rows, counts):
        pl = rows[0::2] // 2  # rows (2j, 2j+1) are pair j
        scores, s_ref, delta = (ro.need(name, reader) for name in ("pair_scores", "pair_s_ref", "delta"))
        old_logp, ref_logp = ro.need("old_logp", reader), ro.get("ref_logp")
        ids, attn, cols, mask, ent, logp = micro_forward(policy, ro, rows, shape.temperature, shape.packed,
                                                         shape.share_prompt, shape.top_k, shape.top_p)
        add_padding(stats, attn, shape.packed)
        ref = ref_logp[rows, cols].to(dev) if ref_logp is not None else None
        batch = PairBatch(logp=logp, old_logp=old_logp[rows, cols].to(dev), mask=mask, ref_logp=ref,
                          scores=scores[pl].to(dev), s_ref=s_ref[pl].to(dev), delta=delta[pl].to(dev))
        loss, metrics = loss_fn(batch, cfg, counts)
        stats.add_all(metrics)
        tokens_here = mask.sum().item()
        stats.add("entropy", masked_sum_f(ent, mask), tokens_here)
        if ref is not None:
            stats.add("kl", masked_sum_f(batch.old_logp - ref, mask), tokens_here)
        return loss

    step_loop(policy, ro, shape, shuffle_seed, begin_step, micro_loss, stats, unit=2)


def add_padding(stats: Sums, attention_mask: torch.Tensor, packed: bool) -> None:
    """padding_frac: the share of the update forwards' positions that are padding (0 when packed)."""
    positions = float(attention_mask.numel())
    stats.add("padding_frac", 0.0 if packed else padding_fraction(attention_mask) * positions, positions)


def masked_sum_f(x: torch.Tensor, mask: torch.Tensor) -> float:
    return float((x * mask).sum())


def global_denominator(mask: torch.Tensor, max_len: int) -> AggDenominator:
    """Sequence and token counts of an optimizer step's minibatch, summed over ranks."""
    lengths = mask.sum(-1)
    seqs, tokens = dist.all_reduce_sum([float((lengths > 0).sum()), float(lengths.sum())])
    return AggDenominator(num_seqs=seqs, num_tokens=tokens, max_len=float(max_len))
