"""Online RL: one loop for every RL preset (GRPO outcome/process, iterative, PPO, P3O, online RFT/DPO, ...).

    rlft train algo=grpo run.name=demo                      # from this run's SFT, rule reward
    rlft train algo=grpo algo.advantage=grpo_process run.name=demo   # PRM step rewards (stage:prm)
    rlft train algo=grpo iterative.iterations=2 reward=rm run.name=demo  # iterative, RM retrained
    rlft train algo=ppo run.name=demo                       # critic (critic.*), GAE
    rlft train algo=p3o run.name=demo                       # pairwise update (algo.pairwise_loss)

Each rollout step (docs/algorithms.md §4, Algorithm 1):
  1. take this rank's share of `rollout.prompts_per_step` prompts and sample G completions each;
  2. score them (rewards.RewardSet), apply the truncation policy;
  3. old log-probs (only when the batch is reused: mu > 1 or several minibatches) and
     reference log-probs (only when kl_coef > 0) in no-grad batched passes;
  4. advantages from the registry (`algo.advantage`), optional dynamic sampling;
  5. mu passes of `minibatches_per_rollout` optimizer steps: per-token policy loss from the
     registry, + kl_coef x KL(current || reference) per token, aggregated with global counts
     (or, with `algo.pairwise_loss`, a PAIRWISE_LOSSES entry on pairs of completions).
The algorithms differ only in the registered functions they name; the loop never asks which.
"""
from __future__ import annotations

import time

import torch

from rlft import envs, handoff, microbatch
from omegaconf import OmegaConf

from rlft.algos import (ADVANTAGES, AGGREGATIONS, IS_CORRECTIONS, KL_ESTIMATORS, PAIRWISE_LOSSES, POLICY_LOSSES,
                        AdaptiveKLController, AdvantageConfig, AdvantageInputs, AggDenominator, ISConfig, PairBatch,
                        PairCounts, PairLossConfig, PolicyLossConfig, dynamic_sampling_keep_mask, frac_zero_std_groups,
                        pair_rollout_inputs)
from rlft.algos.value import value_loss
from rlft.config import needs_reference, trains_critic
from rlft.data.encode import encode_prompts, prompt_budget
from rlft.engine import Engine, dist
from rlft.models import load_model, load_tokenizer, token_scores
from rlft.rewards.scoring import ExactSteps, RewardSet
from rlft.rollout import batch as rb
from rlft.rollout.generate import Sampling, build_engine
from rlft.rollout.logprobs import (chunk_rows, forward_logits, packed_logp, padding_fraction,
                                  response_start, selective_logp, token_logp)
from rlft.envs import episodes
from rlft.stages import common, inputs, iterative


def advantage_config(a, critic, kl_coef: float) -> AdvantageConfig:
    """Estimator options (GAE's from the `critic` section); the KL goes into the reward only when
    algo.kl_in=reward (PPO)."""
    return AdvantageConfig(eps_adv=a.eps_adv, std_unbiased=a.std_unbiased, scale_by_std=a.scale_by_std,
                           rft_threshold=a.rft_threshold, outcome_weight=a.outcome_weight, kl_coef=kl_coef if a.kl_in == "reward" else 0.0,
                           kl_estimator=a.kl_estimator, gamma=critic.gamma, lam=critic.lam,
                           whiten_advantages=critic.whiten_advantages, reduce=dist.sum_over_ranks)


def build_critic(cfg, tokenizer) -> Engine:
    """PPO's critic: a scalar head on every token, from the RM (or another model), own optimizer."""
    critic_cfg = OmegaConf.create(OmegaConf.to_container(cfg, resolve=True))
    critic_cfg.train.lr = cfg.critic.lr
    path = handoff.resolve_model_path(cfg, cfg.critic.init)
    return Engine(critic_cfg, load_model(cfg.model, path, tokenizer, head="rm", seed=cfg.seed, trained=True))


def row_groups(attention_mask: torch.Tensor, first: int, count: int, micro: int, max_tokens: int = 0,
               packed: bool = False, unit: int = 1) -> list[torch.Tensor]:
    """The rows first..first+count-1 of a rollout cut into forwards (rlft.microbatch): `micro` rows at a
    time, or by the token budget `max_tokens`; `unit` consecutive rows stay together (2: a pair)."""
    lengths = attention_mask[first:first + count].sum(-1).tolist()
    items = [lengths[i:i + unit] for i in range(0, count, unit)]
    return [torch.tensor([first + unit * i + u for i in group for u in range(unit)])
            for group in microbatch.plan(items, max(1, micro // unit), max_tokens, packed)]


@torch.no_grad()
def batched_values(critic: Engine, input_ids: torch.Tensor, attention_mask: torch.Tensor, micro: int,
                   max_tokens: int = 0, packed: bool = False) -> torch.Tensor:
    """Critic values [N, L-1] aligned to targets: column p values the state before token p+1 (0 past
    each forward's longest row)."""
    out = torch.zeros(input_ids.shape[0], input_ids.shape[1] - 1, device=input_ids.device)
    for rows in row_groups(attention_mask, 0, len(input_ids), micro, max_tokens, packed):
        width = int(attention_mask[rows].sum(-1).max())
        rows = rows.to(input_ids.device)
        out[rows, :width - 1] = token_scores(critic.module, input_ids[rows, :width],
                                             attention_mask[rows, :width])[:, :-1].float()
    return out


class RLStage:
    """State of one RL run on one rank: policy, reference, rewards, data."""

    def __init__(self, cfg, ctx: common.StageContext):
        self.cfg, self.ctx, self.a = cfg, ctx, cfg.algo
        self.parent = handoff.resolve_model_path(cfg)
        self.tokenizer = load_tokenizer(cfg.model, self.parent)
        common.seed_everything(cfg.seed)
        self.policy = Engine(cfg, load_model(cfg.model, self.parent, self.tokenizer, seed=cfg.seed, trained=True))
        self.ref = None
        if needs_reference(cfg):  # with LoRA the reference is the policy's own base weights (adapter off)
            self.ref = BaseModel(self.policy) if self.policy.has_adapter else self.load_reference(self.parent)
            if self.policy.has_adapter:
                dist.print0("[rlft] reference: the policy's base weights with its LoRA adapter off (no second copy)")
        self.critic = build_critic(cfg, self.tokenizer) if trains_critic(cfg) else None
        self.kl_coef = float(self.a.kl_coef)
        self.kl_ctl = AdaptiveKLController(self.kl_coef, self.a.kl_target, self.a.kl_horizon) \
            if self.a.adaptive_kl else None
        self.env = envs.build(cfg)
        self.rewards = RewardSet(cfg, ctx.info.device, self.env)
        self.step_prm = None  # process supervision: the PRM that scores every step (or the exact step verifier)
        self.step_scorer = None
        if ADVANTAGES.needs(self.a.advantage, "step_scores"):
            if cfg.reward.process == "exact":
                self.step_scorer = ExactSteps(self.env)
            else:
                self.step_prm = self.rewards.models.get("prm") or RewardSet.load_model(cfg, "prm", ctx.info.device)
                self.step_scorer = self.step_prm
        self.train_rows = self.env.rows("train")
        self.test_rows = self.env.rows("test")[:self.a.eval_problems]
        r = cfg.rollout
        self.prompt_budget = prompt_budget(self.policy.module, r.max_new_tokens)
        self.sampling = Sampling(r.max_new_tokens, True, r.temperature, r.top_p, r.top_k)
        self.engine, why = build_engine(cfg, self.policy, self.tokenizer, ctx.info.device, seed=cfg.seed)
        self.is_correction = r.is_correction if r.is_correction != "auto" else \
            ("tis" if self.engine.name == "vllm" else "none")
        self.samples_log: list[dict] = []  # this iteration's scored samples (iterative RL)
        self.samples_drawn = 0  # completions this rank sampled for training (dynamic sampling's extra rounds too)
        dist.print0(f"[rlft] rollout engine: {why}; importance-sampling correction: {self.is_correction}"
                    + (f" ({r.is_level}, C={r.is_cap})" if self.is_correction != "none" else ""))

    def load_reference(self, path: str) -> Engine:
        return Engine(self.cfg, load_model(self.cfg.model, path, self.tokenizer, seed=self.cfg.seed), trainable=False)

    # ------------------------------------------------------------------ rollout
    def generate(self, prompt_ids: list[list[int]], n: int, sampling: Sampling, seed: int):
        """n completions per prompt from the policy's current weights (synced into the engine first)."""
        self.engine.sync_weights(self.policy.global_step)
        return self.engine.generate(prompt_ids, n, sampling, seed)

    def episodes(self, rows: list[dict], prompt_ids: list[list[int]], n: int, sampling: Sampling, seed: int):
        """n trajectories per row through the environment (one engine call for a single-turn one)."""
        self.engine.sync_weights(self.policy.global_step)
        return episodes.sample(self.engine, self.env, rows, prompt_ids, n, sampling, seed, self.tokenizer,
                               episodes.limits(self.cfg, self.env, self.tokenizer))

    def sample(self, rows: list[dict], seed: int) -> rb.Rollout:
        """G trajectories for each row, as padded tensors (no scores yet)."""
        G, tok = self.cfg.rollout.samples_per_prompt, self.tokenizer
        prompt_texts = [inputs.render(self.cfg, tok, r["prompt"]) for r in rows]
        prompt_ids = encode_prompts(tok, prompt_texts, self.prompt_budget, "rollout")
        gens = self.episodes(rows, prompt_ids, G, self.sampling, seed)
        self.samples_drawn += len(gens.texts)
        per_prompt = [prompt_ids[i] for i in gens.prompt_index]
        ids, attn, mask = rb.build_sequences(per_prompt, gens.completion_ids, tok.pad_token_id, gens.token_mask)
        episode = {} if gens.turns is None else \
            {"turns": gens.turns, "tool_calls": gens.tool_calls, "tool_errors": gens.tool_errors}
        return rb.Rollout(rows=[rows[i] for i in gens.prompt_index],
                          prompt_texts=[prompt_texts[i] for i in gens.prompt_index],
                          completions=gens.texts, completion_ids=gens.completion_ids, input_ids=ids,
                          attention_mask=attn, mask=mask, truncated=torch.tensor(gens.truncated),
                          prompt_lens=[len(p) for p in per_prompt], sampler_logp=gens.logp,
                          token_mask=gens.token_mask, episode=episode)

    def score(self, ro: rb.Rollout) -> None:
        prompts = [r["prompt"] for r in ro.rows]
        total, ro.per_source = self.rewards(prompts, ro.prompt_texts, ro.completions, ro.rows)
        r = self.cfg.reward
        ro.scores, ro.mask = rb.apply_truncation_policy(total, ro.mask, ro.truncated, r.truncation_policy,
                                                        r.truncation_penalty)
        if self.step_scorer is not None:
            probs, char_ends = self.step_scorer.steps(ro.prompt_texts, ro.completions, ro.rows)
            ro.step_scores = probs
            ro.step_ends = [rb.step_columns(self.tokenizer, c, e, p) if e else []
                            for c, e, p in zip(ro.completion_ids, char_ends, ro.prompt_lens)]

    def rollout(self, rollout_index: int) -> rb.Rollout:
        """Sample and score this rank's prompts; dynamic sampling refills all-equal groups."""
        a, r, info = self.a, self.cfg.rollout, self.ctx.info
        G = r.samples_per_prompt

        def rank_rows(seed_offset: int) -> list[dict]:
            idx = common.step_indices(rollout_index, r.prompts_per_step, len(self.train_rows),
                                      self.cfg.seed + seed_offset)
            mine = minibatch_shard(idx, a.minibatches_per_rollout, info.rank, info.world_size)
            return [self.train_rows[i] for i in mine]

        def seed(round_: int) -> int:  # the engine's sampling seed (vllm; hf draws from torch's generator)
            return ((self.cfg.seed * 1_000_003 + rollout_index) * 31 + round_) * 4099 + info.rank

        ro = self.sample(rank_rows(0), seed(0))
        self.score(ro)
        if not r.dynamic_sampling:
            return ro
        for round_ in range(1, r.max_sampling_rounds):
            keep = dynamic_sampling_keep_mask(ro.scores, G)
            if bool(keep.all()):
                break
            extra = self.sample(rank_rows(7919 * round_), seed(round_))
            self.score(extra)
            ro = merge_informative(ro, extra, keep, dynamic_sampling_keep_mask(extra.scores, G), G,
                                  self.tokenizer.pad_token_id)
        return ro

    def prepare(self, ro: rb.Rollout) -> None:
        """Old and reference log-probs, then advantages."""
        a, t = self.a, self.cfg.train
        micro, budget = t.micro_batch_per_device, t.max_tokens_per_micro_batch
        dev = self.ctx.info.device
        ids, attn = ro.input_ids.to(dev), ro.attention_mask.to(dev)
        temperature = self.cfg.rollout.temperature
        reuse = (a.updates_per_rollout > 1 or a.minibatches_per_rollout > 1 or a.kl_in == "reward"
                 or a.pairwise_loss is not None)
        if reuse or self.is_correction != "none":
            ro.old_logp = rollout_logp(self.policy, ro, micro, temperature, t.packing, budget)
        if self.ref is not None:
            ro.ref_logp = rollout_logp(self.ref, ro, micro, temperature, t.packing, budget)
        keep = None
        if ro.old_logp is not None and ro.sampler_logp is not None:  # engine vs trainer: mismatch, correction
            r = self.cfg.rollout
            engine_logp = rb.target_aligned(ro.sampler_logp, ro.prompt_lens, ro.mask.shape[1])
            ro.is_weight, keep, ro.is_metrics = IS_CORRECTIONS.get(self.is_correction)(
                ro.old_logp, engine_logp, ro.mask, ISConfig(r.is_level, r.is_cap))
        if self.critic is not None:
            ro.values = batched_values(self.critic, ids, attn, micro, budget, t.packing)
        G = self.cfg.rollout.samples_per_prompt
        if a.pairwise_loss is not None:
            ro.pair_scores, ro.pair_s_ref, ro.delta = pair_rollout_inputs(ro.scores, ro.old_logp, ro.ref_logp, ro.mask,
                                                                          G, self.kl_coef)
            return
        batch = AdvantageInputs(scores=ro.scores, mask=ro.mask, group_size=G, step_ends=ro.step_ends,
                                step_scores=ro.step_scores, old_logp=ro.old_logp, ref_logp=ro.ref_logp,
                                values=ro.values)
        out = ADVANTAGES.get(a.advantage)(batch, advantage_config(a, self.cfg.critic, self.kl_coef))
        ro.adv, ro.returns = out.adv.float(), out.returns
        if keep is not None:  # tokens the correction dropped leave the loss and its counts
            ro.mask = keep.to(ro.mask.dtype)

    def adapt_kl(self, ro: rb.Rollout) -> None:
        """Adaptive KL (§3): move kl_coef towards the target sequence KL."""
        if self.kl_ctl is None or ro.ref_logp is None or ro.old_logp is None:
            return
        seq_kl = ((ro.old_logp - ro.ref_logp) * ro.mask).sum(-1)
        total, count = dist.all_reduce_sum([float(seq_kl.sum()), float(len(ro))])
        self.kl_ctl.update(total / max(count, 1.0), int(count))
        self.kl_coef = float(self.kl_ctl.value)

    def update(self, ro: rb.Rollout, stats: common.Sums, rollout_index: int) -> None:
        t = self.cfg.train
        micro, budget, packed = t.micro_batch_per_device, t.max_tokens_per_micro_batch, t.packing
        seed = (self.cfg.seed * 1_000_003 + rollout_index) * 4099 + self.ctx.info.rank
        if self.a.pairwise_loss is not None:
            update_pairwise(self.policy, self.a, self.cfg.pairwise, self.cfg.rollout, micro, ro, stats, self.kl_coef,
                            seed, packed=packed, max_tokens=budget)
        else:
            update_policy(self.policy, self.ref, self.a, self.cfg.rollout, micro, ro, stats, self.critic, self.kl_coef,
                          seed, value_clip=self.cfg.critic.value_clip, packed=packed, max_tokens=budget)

    # ------------------------------------------------------------------ eval
    @torch.no_grad()
    def greedy_accuracy(self) -> dict:
        info, tok = self.ctx.info, self.tokenizer
        shard = self.test_rows[info.rank::info.world_size]
        prompt_ids = encode_prompts(tok, [inputs.render(self.cfg, tok, r["prompt"]) for r in shard], self.prompt_budget,
                                    "held-out accuracy")
        gens = self.episodes(shard, prompt_ids, 1, Sampling(self.cfg.rollout.max_new_tokens, do_sample=False), 0)
        self.engine.sleep()
        correct = sum(s.correct for s in self.env.scores(shard, gens.texts))
        correct, total = dist.all_reduce_sum([float(correct), float(len(shard))])
        return {"eval_greedy_accuracy": correct / max(total, 1.0)}


class BaseModel:
    """The reference of a LoRA policy: the policy's forward with its adapter disabled (no second copy)."""

    def __init__(self, policy: Engine):
        self.policy = policy

    @property
    def device(self) -> torch.device:
        return self.policy.device

    def __call__(self, *args, **kwargs):
        with self.policy.adapter_disabled():
            return self.policy(*args, **kwargs)


@torch.no_grad()
def rollout_logp(engine: Engine, ro: rb.Rollout, micro: int, temperature: float, packed: bool = False,
                 max_tokens: int = 0) -> torch.Tensor:
    """Per-token log-probs [N, L-1] of the rollout's sequences under `engine` (old or reference),
    forward by forward (`micro` rows, or the token budget `max_tokens`), each trimmed to its longest
    row with logits from its first response column on (`packed`: one padding-free forward each,
    logits only at response tokens). Columns outside the response are not used."""
    dev = engine.device
    out = torch.zeros(ro.mask.shape, device=dev)
    for rows in row_groups(ro.attention_mask, 0, ro.input_ids.shape[0], micro, max_tokens, packed):
        width = int(ro.attention_mask[rows].sum(-1).max())
        ids, attn = ro.input_ids[rows, :width].to(dev), ro.attention_mask[rows, :width].to(dev)
        mask = ro.mask[rows, :width - 1].to(dev)
        if packed:
            logp = packed_logp(engine, ids, attn, mask, temperature)
        else:
            logp = token_logp(engine, ids, attn, temperature, response_start(mask))
        out[rows.to(dev), :width - 1] = logp.float()
    return out


def micro_forward(policy: Engine, ro: rb.Rollout, sl, temperature: float, packed: bool = False):
    """One micro-batch of the rollout (rows: a slice or row indices) through the policy (with grad),
    trimmed to its longest row
    and, for the logits, to the target columns from its first response token on:
    (ids, attention mask, cols, response mask, token entropy (no grad), per-token log-probs).
    `cols` selects those columns from any [N, L-1] rollout tensor (old/ref log-probs, advantages,
    values). `packed`: one padding-free forward (train.packing), the same values."""
    dev = policy.device
    width = int(ro.attention_mask[sl].sum(-1).max())
    ids, attn = ro.input_ids[sl, :width].to(dev), ro.attention_mask[sl, :width].to(dev)
    start = response_start(ro.mask[sl, :width - 1])
    cols = slice(start, width - 1)
    mask = ro.mask[sl, cols].to(dev)
    if packed:
        logp, extra = packed_logp(policy, ids, attn, ro.mask[sl, :width - 1].to(dev), temperature, ("entropy",))
        return ids, attn, cols, mask, extra["entropy"][:, cols], logp[:, cols]
    logits = forward_logits(policy, ids, attn, start, temperature)
    return ids, attn, cols, mask, entropy(logits.detach()), selective_logp(logits, ids[:, start + 1:])


def epoch_rollout(ro: rb.Rollout, a, group_size: int, epoch: int, shuffle_seed: int | None) -> rb.Rollout:
    """The rollout as pass `epoch` sees it: with algo.shuffle_minibatches, this rank's groups in a
    fresh seeded order, so each pass cuts different minibatches."""
    if shuffle_seed is None or not a.shuffle_minibatches:
        return ro
    return rb.take(ro, rb.group_shuffle_order(len(ro), group_size, shuffle_seed * 101 + epoch))


def optimizer_steps(rollout: rb.Rollout, a, group_size: int, shuffle_seed: int | None):
    """(the rollout as this pass orders it, first row, rows) of each optimizer step: mu passes
    (`algo.updates_per_rollout`) of `algo.minibatches_per_rollout` steps each."""
    n = len(rollout)
    per_mb = n // a.minibatches_per_rollout
    for epoch in range(a.updates_per_rollout):
        ro = epoch_rollout(rollout, a, group_size, epoch, shuffle_seed)
        for start in range(0, n, per_mb):
            yield ro, start, per_mb


def update_policy(policy: Engine, ref: Engine | None, a, r, micro: int, ro: rb.Rollout, stats: common.Sums,
                  critic: Engine | None = None, kl_coef: float | None = None,
                  shuffle_seed: int | None = None, value_clip: float = 0.2, packed: bool = False,
                  max_tokens: int = 0) -> None:
    """mu passes over the rollout, `minibatches_per_rollout` optimizer steps each.

    Every micro-batch loss is normalised by the counts of its whole minibatch on all ranks,
    so the update does not depend on micro-batch size, accumulation or world size. `r` is the
    rollout config (temperature, max_new_tokens); with `ro.is_weight` (engine-mismatch correction)
    each token's policy loss is reweighted before the KL term is added."""
    dev = policy.device
    policy_loss = POLICY_LOSSES.get(a.policy_loss)
    aggregate = AGGREGATIONS.get(a.loss_agg)
    kl_fn = KL_ESTIMATORS.get(a.kl_estimator)
    pl_cfg = PolicyLossConfig(a.clip_eps_low, a.clip_eps_high, a.dual_clip_c)
    for ro, start, per_mb in optimizer_steps(ro, a, r.samples_per_prompt, shuffle_seed):
        denom = global_denominator(ro.mask[start:start + per_mb], r.max_new_tokens)
        groups = row_groups(ro.attention_mask, start, per_mb, micro, max_tokens, packed)
        stats.add("micro_batches", len(groups), 1)  # forwards per rank in this optimizer step
        for k, sl in enumerate(groups):
            last = k == len(groups) - 1
            ids, attn, cols, mask, ent, logp = micro_forward(policy, ro, sl, r.temperature, packed)
            add_padding(stats, attn, packed)
            old = ro.old_logp[sl, cols].to(dev) if ro.old_logp is not None else None
            loss_tok, metrics = policy_loss(logp, old, ro.adv[sl, cols].to(dev), mask, pl_cfg)
            if ro.is_weight is not None:
                loss_tok = loss_tok * ro.is_weight[sl, cols].to(dev)
            tokens = mask.sum().item()
            if ref is not None:
                kl = kl_fn(logp, ro.ref_logp[sl, cols].to(dev))
                if a.kl_in == "loss":
                    loss_tok = loss_tok + (a.kl_coef if kl_coef is None else kl_coef) * kl
                stats.add("kl", masked_sum_f(kl.detach(), mask), tokens)
            policy.backward(aggregate(loss_tok, mask, denom), last=last)
            policy.step()
            if critic is not None:
                values = token_scores(critic.module, ids, attn)[:, :-1][:, cols.start:]
                vloss, vm = value_loss(values, ro.values[sl, cols].to(dev),
                                       ro.returns[sl, cols].to(dev), mask, value_clip, denom)
                critic.backward(vloss, last=last)
                critic.step()
                stats.add("value_loss", vloss.item() * denom.num_tokens, tokens)
                stats.add("vf_explained_var", vm["vf_explained_var"].item() * tokens, tokens)
                stats.add("vf_clipfrac", vm["vf_clipfrac"].item() * tokens, tokens)
            stats.add("clipfrac", metrics["clipfrac"].item() * tokens, tokens)
            stats.add("entropy", masked_sum_f(ent, mask), tokens)


def minibatch_shard(indices: list[int], minibatches: int, rank: int, world: int) -> list[int]:
    """This rank's prompts: its share of every minibatch, minibatch by minibatch.

    Minibatch k holds the same prompts whatever the world size, so an update with several
    minibatches per rollout does not depend on the number of ranks."""
    per_mb = len(indices) // minibatches
    per_rank = per_mb // world
    return [i for k in range(minibatches)
            for i in indices[k * per_mb + rank * per_rank:k * per_mb + (rank + 1) * per_rank]]


def update_pairwise(policy: Engine, a, pairwise, r, micro: int, ro: rb.Rollout, stats: common.Sums,
                    kl_coef: float, shuffle_seed: int | None = None, packed: bool = False, max_tokens: int = 0) -> None:
    """Pairwise updates on rows (2j, 2j+1) with the PAIRWISE_LOSSES entry `algo.pairwise_loss`
    (P3O §10, online DPO §9); each micro-batch's loss is normalised by its optimizer step's counts."""
    dev = policy.device
    loss_fn = PAIRWISE_LOSSES.get(a.pairwise_loss)
    cfg = PairLossConfig(eps=a.clip_eps_low, c=pairwise.c, kl_coef=kl_coef, kl_at=str(pairwise.kl_at),
                         avg_tokenwise=pairwise.avg_tokenwise, beta=pairwise.beta,
                         length_normalize=pairwise.length_normalize)
    for ro, start, per_mb in optimizer_steps(ro, a, r.samples_per_prompt, shuffle_seed):
        m = ro.mask[start:start + per_mb]
        untied = float((ro.pair_scores[start // 2:(start + per_mb) // 2].diff(dim=-1) != 0).sum())
        pairs, tokens, untied = dist.all_reduce_sum([m.shape[0] / 2.0, float(m.sum()), untied])
        counts = PairCounts(pairs=pairs, tokens=tokens, untied=untied)
        groups = row_groups(ro.attention_mask, start, per_mb, micro, max_tokens, packed, unit=2)
        stats.add("micro_batches", len(groups), 1)
        for k, sl in enumerate(groups):
            pl = sl[0::2] // 2  # rows (2j, 2j+1) are pair j
            ids, attn, cols, mask, ent, logp = micro_forward(policy, ro, sl, r.temperature, packed)
            add_padding(stats, attn, packed)
            ref = ro.ref_logp[sl, cols].to(dev) if ro.ref_logp is not None else None
            batch = PairBatch(logp=logp, old_logp=ro.old_logp[sl, cols].to(dev), mask=mask, ref_logp=ref,
                              scores=ro.pair_scores[pl].to(dev), s_ref=ro.pair_s_ref[pl].to(dev),
                              delta=ro.delta[pl].to(dev))
            loss, metrics = loss_fn(batch, cfg, counts)
            policy.backward(loss, last=k == len(groups) - 1)
            policy.step()
            stats.add_all(metrics)
            tokens_here = mask.sum().item()
            stats.add("entropy", masked_sum_f(ent, mask), tokens_here)
            if ref is not None:
                stats.add("kl", masked_sum_f(batch.old_logp - ref, mask), tokens_here)


def add_padding(stats: common.Sums, attention_mask: torch.Tensor, packed: bool) -> None:
    """padding_frac: the share of the update forwards' positions that are padding (0 when packed)."""
    positions = float(attention_mask.numel())
    stats.add("padding_frac", 0.0 if packed else padding_fraction(attention_mask) * positions, positions)


def masked_sum_f(x: torch.Tensor, mask: torch.Tensor) -> float:
    return float((x * mask).sum())


def entropy(logits: torch.Tensor, rows_per_chunk: int | None = None) -> torch.Tensor:
    """Token entropy [B, T] of the policy's distribution, a few rows at a time in fp32 (as many as
    fit in logprobs.CHUNK_BYTES unless given)."""
    out = []
    for lg in logits.split(rows_per_chunk or chunk_rows(logits)):
        lg = lg.float()
        logp = lg - torch.logsumexp(lg, -1, keepdim=True)
        out.append(-(logp.exp() * logp).sum(-1))
    return torch.cat(out)


def global_denominator(mask: torch.Tensor, max_len: int) -> AggDenominator:
    """Sequence and token counts of an optimizer step's minibatch, summed over ranks."""
    lengths = mask.sum(-1)
    seqs, tokens = dist.all_reduce_sum([float((lengths > 0).sum()), float(lengths.sum())])
    return AggDenominator(num_seqs=seqs, num_tokens=tokens, max_len=float(max_len))


def merge_informative(ro: rb.Rollout, extra: rb.Rollout, keep: torch.Tensor, keep_extra: torch.Tensor,
                      G: int, pad_id: int) -> rb.Rollout:
    """Replace all-equal groups of `ro` by informative groups of `extra` (same batch size)."""
    groups = [("ro", g) for g in range(len(keep)) if keep[g]]
    groups += [("extra", g) for g in range(len(keep_extra)) if keep_extra[g]]
    groups += [("ro", g) for g in range(len(keep)) if not keep[g]]  # fill up if still short
    groups = groups[:len(keep)]
    rows = [(ro if src == "ro" else extra, g * G + j) for src, g in groups for j in range(G)]
    return rb.concat_rows(rows, pad_id)


def rollout_metrics(ro: rb.Rollout, stats: common.Sums, G: int) -> None:
    n = float(len(ro))
    stats.add("reward", float(ro.scores.sum()), n)
    stats.add("reward_sq", float((ro.scores ** 2).sum()), n)
    for name, values in ro.per_source.items():
        stats.add(f"reward/{name}", sum(values), n)
    lengths = [sum(w) for w in ro.token_mask] if ro.token_mask is not None else [len(c) for c in ro.completion_ids]
    stats.add("response_len", sum(lengths), n)  # tokens the model sampled (environment tokens not counted)
    for name, values in ro.episode.items():  # multi-turn: turns, tool calls and tool errors per trajectory
        stats.add(name, float(sum(values)), n)
    if ro.episode:
        stats.add("tool_use_frac", float(sum(c > 0 for c in ro.episode["tool_calls"])), n)
    stats.add("truncated_frac", float(ro.truncated.sum()), n)
    if ro.is_metrics:  # engine vs trainer log-probs on the response tokens
        tokens = float(ro.mask.sum())
        for name in ("engine_logp_gap_mean", "is_weight_mean", "is_corrected_frac"):
            if name in ro.is_metrics:
                stats.add(name, float(ro.is_metrics[name]) * tokens, tokens)
        stats.add_max("engine_logp_gap_max", float(ro.is_metrics["engine_logp_gap_max"]))
    if G > 1:
        stats.add("frac_zero_std", float(frac_zero_std_groups(ro.scores, G)) * (n / G), n / G)


def run(cfg, ctx: common.StageContext) -> dict:
    common.prepare_run_dir(ctx)
    stage = RLStage(cfg, ctx)
    a, t = cfg.algo, cfg.train
    steps_per_rollout = a.updates_per_rollout * a.minibatches_per_rollout
    total_rollouts = t.max_steps // steps_per_rollout
    iterations = cfg.iterative.iterations
    rollouts_per_iteration = total_rollouts // iterations
    companions = {"critic": stage.critic} if stage.critic is not None else None
    resumed = common.resume_state(ctx, stage.policy, companions)
    start_step = int(resumed.get("step", 0))
    stage.samples_drawn = int(resumed.get("samples_drawn", 0))
    if "kl_coef" in resumed:  # the adaptive KL controller's value when the checkpoint was written
        stage.kl_coef = float(resumed["kl_coef"])
        if stage.kl_ctl is not None:
            stage.kl_ctl.value = stage.kl_coef
    if start_step and iterations > 1:  # the reward models and reference of the iteration resumed into
        iterative.restore(stage, (start_step // steps_per_rollout - 1) // rollouts_per_iteration,
                          resumed.get("samples_log", []))
        common.set_rng_state(resumed["rng"])  # loading those models may have drawn random numbers
    tracker = common.Tracker(ctx.run_dir, cfg, ctx.info.is_main, t.max_steps, start_step)
    stats, times = common.Sums(), {"rollout": 0.0, "prepare": 0.0, "update": 0.0}
    rollouts_in_window = 0  # rollouts since the last log line: the time_* figures are per rollout
    summary: dict = {}
    if start_step == 0 and a.eval_every:
        tracker.log(0, stage.greedy_accuracy())
    for r in range(start_step // steps_per_rollout, total_rollouts):
        iteration = r // rollouts_per_iteration
        if r > 0 and r % rollouts_per_iteration == 0 and r * steps_per_rollout >= start_step:
            iterative.next_iteration(stage, iteration)
        tic = time.time()
        ro = stage.rollout(r)
        stage.engine.sleep()  # a GPU engine frees its memory for the trainer until the next sync
        times["rollout"] += time.time() - tic
        tic = time.time()
        stage.prepare(ro)
        times["prepare"] += time.time() - tic
        tic = time.time()
        stage.update(ro, stats, r)
        stage.adapt_kl(ro)
        times["update"] += time.time() - tic
        rollout_metrics(ro, stats, cfg.rollout.samples_per_prompt)
        if iterations > 1:
            stage.samples_log.extend(iterative.sample_records(stage, ro))
        done = (r + 1) * steps_per_rollout
        rollouts_in_window += 1
        tracker.advance(steps_per_rollout)
        if done % t.log_every == 0 or done == t.max_steps:
            summary = stats.reduce()
            summary["reward_std"] = max(summary.pop("reward_sq") - summary["reward"] ** 2, 0.0) ** 0.5
            summary.update({f"time_{k}_s": v / rollouts_in_window for k, v in times.items()}, lr=stage.policy.lr(),
                           iteration=iteration, kl_coef=stage.kl_coef,
                           samples_seen=int(dist.all_reduce_sum([float(stage.samples_drawn)])[0]))
            if a.eval_every and done % a.eval_every == 0 and done != t.max_steps:
                summary.update(stage.greedy_accuracy())
            tracker.log(done, summary)
            stats, times, rollouts_in_window = common.Sums(), {k: 0.0 for k in times}, 0
        def save(done=done):
            client = {"step": done, "rng": common.rng_state(), "kl_coef": stage.kl_coef,
                      "samples_drawn": stage.samples_drawn}
            if iterations > 1:  # this iteration's samples so far: what the reward models retrain on
                client["samples_log"] = stage.samples_log
            return stage.policy.save_checkpoint(ctx.ckpt_root, done, client, t.keep_checkpoints, companions)

        if t.save_every and done % t.save_every == 0 and done != t.max_steps:
            save()
        common.stop_if_signalled(ctx, done, save)
    final_eval = stage.greedy_accuracy()
    tracker.log(t.max_steps, final_eval)
    summary.update(final_eval)
    tracker.close()
    if stage.critic is not None:
        stage.critic.export_hf(ctx.run_dir / "critic", stage.tokenizer)
    common.finish(ctx, stage.policy, stage.tokenizer, stage.parent, summary)
    return summary
