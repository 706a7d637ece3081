"""The experience step of online RL: from the policy's current weights to a rollout the update reads.

Its phases, each timed and logged as `time/<phase>_s` (seconds per rollout):

    sample      this rank's prompts, G trajectories each, through the environment (rollout engine)
    score       rewards (the environment's, + reward.functions), the truncation policy, step scores
                for process supervision; dynamic sampling repeats sample and score for all-equal groups
    logprobs    old log-probs (when the batch is reused, the engine's log-probs are corrected or the
                estimator reads them), reference log-probs (when the KL needs them), the engine-mismatch
                IS weights
    teacher     the teacher's log-probs of the sampled tokens (estimators that declare "teacher")
    values      the critic's values (estimators that declare "critic")
    advantages  the registered estimator, or a pairwise loss's pair inputs

`Experience` holds what those phases read (sampler, environment, rewards, reference, critic) and no
training state: the update step (rlft.stages.update) owns the optimizer steps. Iterative RL swaps the
reference and the reward models through `use_reference` and `scorers` (docs/algorithms.md §4).
"""
from __future__ import annotations

import time
from contextlib import contextmanager

import torch

from rlft import dist, envs
from rlft.algos import (ADVANTAGES, IS_CORRECTIONS, AdvantageConfig, AdvantageInputs, ISConfig,
                        dynamic_sampling_keep_mask, pair_rollout_inputs)
from rlft.config.arithmetic import distill_sampled
from rlft.data.encode import encode_prompts, prompt_budget
from rlft.envs import episodes
from rlft.microbatch import rollout_groups
from rlft.model_source import resolve_model_path
from rlft.models import token_scores
from rlft.rewards.scoring import ExactSteps, RewardSet
from rlft.rollout import batch as rb
from rlft.rollout.generate import Sampling, build_engine
from rlft.rollout.logprobs import packed_logp, response_start, token_logp
from rlft.stages import inputs
from rlft.stages.prompts import Curriculum, DifficultyPool, PromptSource

PHASES = ("sample", "score", "logprobs", "teacher", "values", "advantages")


def advantage_config(algo, critic, kl_coef: float) -> AdvantageConfig:
    """Estimator options (GAE's from the `critic` section); the KL goes into the reward only when
    algo.kl_in=reward (PPO)."""
    return AdvantageConfig(eps_adv=algo.eps_adv, std_unbiased=algo.std_unbiased, scale_by_std=algo.scale_by_std,
                           rft_threshold=algo.rft_threshold, outcome_weight=algo.outcome_weight,
                           distill_coef=algo.distill_coef, distill_sampled=distill_sampled(algo),
                           kl_coef=kl_coef if algo.kl_in == "reward" else 0.0,
                           kl_estimator=algo.kl_estimator, gamma=critic.gamma, lam=critic.lam,
                           whiten_advantages=critic.whiten_advantages, whiten_rewards=critic.whiten_rewards,
                           whiten_unbiased=critic.whiten_unbiased, reduce=dist.sum_over_ranks)


def rollout_needs(algo, has_reference: bool, correction: str) -> frozenset[str]:
    """The rollout extras (rlft.rollout.batch.EXTRAS) a run computes: the advantages and what its
    estimator declares (step scores, the critic's values and returns, the teacher's log-probs with pi_old's),
    or a pairwise loss's pair inputs; pi_old where the update reads the sampling-time log-probs
    (`reuses_rollout`) or the engine's are corrected (with the IS weights); the reference's log-probs when
    there is a reference."""
    needs = set()
    if algo.pairwise_loss is not None:
        needs |= {"pair_scores", "pair_s_ref", "delta"}
    else:
        needs.add("adv")
        if ADVANTAGES.needs(algo.advantage, "step_scores"):
            needs |= {"step_ends", "step_scores"}
        if ADVANTAGES.needs(algo.advantage, "critic"):
            needs |= {"values", "returns"}
        if ADVANTAGES.needs(algo.advantage, "teacher") and distill_sampled(algo):
            needs |= {"teacher_logp", "old_logp"}
    if reuses_rollout(algo) or correction != "none":
        needs.add("old_logp")
    if correction != "none":
        needs.add("is_weight")
    if has_reference:
        needs.add("ref_logp")
    return frozenset(needs)


def reuses_rollout(algo) -> bool:
    """Whether the update reads the policy's log-probs at sampling time (pi_old): several passes or
    minibatches over one rollout, the KL in the reward, or a pairwise loss's ratios."""
    return (algo.updates_per_rollout > 1 or algo.minibatches_per_rollout > 1 or algo.kl_in == "reward"
            or algo.pairwise_loss is not None)


@torch.no_grad()
def rollout_logp(model, ro: rb.Rollout, micro: int, temperature: float, packed: bool = False,
                 max_tokens: int = 0, share_prompt: bool = False, top_k: int = 0, top_p: float = 1.0) -> torch.Tensor:
    """Per-token log-probs [N, L-1] of the rollout's sequences under `model` (old or reference),
    forward by forward (`micro` rows, or the token budget `max_tokens`), each trimmed to its longest
    row with logits from its first response column on (`packed`: one padding-free forward each,
    logits only at response tokens). Columns outside the response are not used. The result lives beside
    the rollout's other tensors (on the CPU); the update moves each micro-batch's slice to the device."""
    dev = model.device
    out = torch.zeros(ro.mask.shape, device=ro.mask.device)
    for rows in rollout_groups(ro.attention_mask, 0, ro.input_ids.shape[0], micro, max_tokens, packed):
        width = int(ro.attention_mask[rows].sum(-1).max())
        ids, attn = ro.input_ids[rows, :width].to(dev), ro.attention_mask[rows, :width].to(dev)
        mask = ro.mask[rows, :width - 1].to(dev)
        if packed:
            logp = packed_logp(model, ids, attn, mask, temperature, top_k=top_k, top_p=top_p)
        else:
            logp = token_logp(model, ids, attn, temperature, response_start(mask),
                              rb.prompt_lens_of(ro, rows) if share_prompt else None, mask, top_k=top_k, top_p=top_p)
        out[rows, :width - 1] = logp.float().to(out.device)
    return out


@torch.no_grad()
def batched_values(critic, input_ids: torch.Tensor, attention_mask: torch.Tensor, micro: int,
                   max_tokens: int = 0, packed: bool = False) -> torch.Tensor:
    """Critic values [N, L-1] aligned to targets: column p values the state before token p+1 (0 past
    each forward's longest row), on the CPU like the rollout's other tensors."""
    dev = critic.device
    out = torch.zeros(input_ids.shape[0], input_ids.shape[1] - 1)
    for rows in rollout_groups(attention_mask, 0, len(input_ids), micro, max_tokens, packed):
        width = int(attention_mask[rows].sum(-1).max())
        out[rows, :width - 1] = token_scores(critic.module, input_ids[rows, :width].to(dev),
                                             attention_mask[rows, :width].to(dev))[:, :-1].float().cpu()
    return out


def is_correction(cfg, sampler) -> str:
    """The engine-mismatch correction `rollout.is_correction` names; auto: tis for vLLM, whose log-probs
    differ from the trainer's, and for asynchronous sampling, whose weights lag; none for the trainer's own
    forward (hf)."""
    rollout = cfg.rollout
    if rollout.is_correction != "auto":
        return rollout.is_correction
    return "tis" if rollout.max_staleness else sampler.default_is_correction  # async: the sampler lags


def minibatch_shard(indices: list[int], minibatches: int, rank: int, world: int) -> list[int]:
    """This rank's prompts: its share of every minibatch, minibatch by minibatch.

    Minibatch k holds the same prompts whatever the world size, so an update with several
    minibatches per rollout does not depend on the number of ranks."""
    per_mb = len(indices) // minibatches
    per_rank = per_mb // world
    return [i for k in range(minibatches)
            for i in indices[k * per_mb + rank * per_rank:k * per_mb + (rank + 1) * per_rank]]


def merge_informative(ro: rb.Rollout, extra: rb.Rollout, keep: torch.Tensor, keep_extra: torch.Tensor,
                      G: int, pad_id: int) -> rb.Rollout:
    """Replace all-equal groups of `ro` by informative groups of `extra` (same batch size)."""
    groups = [("ro", g) for g in range(len(keep)) if keep[g]]
    groups += [("extra", g) for g in range(len(keep_extra)) if keep_extra[g]]
    groups += [("ro", g) for g in range(len(keep)) if not keep[g]]  # fill up if still short
    groups = groups[:len(keep)]
    rows = [(ro if src == "ro" else extra, g * G + j) for src, g in groups for j in range(G)]
    return rb.concat_rows(rows, pad_id)


def prompt_source(cfg, env, train_rows: list[dict]) -> PromptSource:
    """The configured choice of each rollout's prompts: the data order, the difficulty pool, the curriculum."""
    pool_cfg, cur_cfg = cfg.rollout.pool, cfg.env.curriculum
    pool = DifficultyPool(float(pool_cfg.easy), float(pool_cfg.hard), int(pool_cfg.revisit_after)) \
        if pool_cfg.enabled else None
    curriculum, rows_at = None, (lambda level: train_rows)
    if cur_cfg.enabled:
        top = env.curriculum_levels()
        last = top if int(cur_cfg.max_level) < 0 else min(int(cur_cfg.max_level), top)
        curriculum = Curriculum(level=min(int(cur_cfg.start_level), last), max_level=last,
                                threshold=float(cur_cfg.threshold), window=int(cur_cfg.window))
        rows_at = env.level_rows
    return PromptSource(rows_at, int(cfg.rollout.prompts_per_step or 0), int(cfg.seed), pool, curriculum)  # 0: unvalidated


class Experience:
    """The experience step on one rank. Built from its parts (`build` makes them from the config), so
    a benchmark or a test can run the real phases with its own environment or models."""

    def __init__(self, cfg, info: dist.DistInfo, tokenizer, policy, *, sampler=None, env=None, rewards=None,
                 reference=None, critic=None, step_scorer=None, is_correction: str = "none", teacher=None):
        self.cfg, self.info, self.tokenizer, self.policy = cfg, info, tokenizer, policy
        self.sampler, self.env, self.rewards = sampler, env, rewards
        self.reference, self.critic, self.step_scorer = reference, critic, step_scorer
        self.teacher = teacher
        self.is_correction = is_correction
        self.ahead = None  # the AsyncSampler (rollout.max_staleness > 0)
        rollout = cfg.rollout
        self.sampling = Sampling.of_rollout(rollout)
        self.train_rows = env.rows("train") if env is not None else []
        self.test_rows = env.rows("test")[:cfg.algo.eval_problems] if env is not None else []
        self.prompt_source = prompt_source(cfg, env, self.train_rows)
        self.samples_drawn = 0  # completions this rank sampled for training (dynamic sampling's extra rounds too)
        self.times = dict.fromkeys(PHASES, 0.0)  # seconds per phase since the last `take_times`

    @classmethod
    def build(cls, cfg, info: dist.DistInfo, tokenizer, policy, reference=None, critic=None,
              model_path: str | None = None, teacher=None) -> "Experience":
        """The configured environment, rewards, step scorer and rollout engine around `policy`; with
        rollout.max_staleness > 0 also the sampler process (its model built from `model_path`)."""
        env = envs.build(cfg, tokenizer)
        rewards = RewardSet(cfg, info.device, env)
        step_scorer = None
        if ADVANTAGES.needs(cfg.algo.advantage, "step_scores"):  # process supervision
            step_scorer = ExactSteps(env) if cfg.reward.process == "exact" else \
                (rewards.models.get("prm") or RewardSet.load_model(cfg, "prm", info.device))
        sampler, why = build_engine(cfg, policy, tokenizer, info.device, seed=cfg.seed)
        rollout, correction = cfg.rollout, is_correction(cfg, sampler)
        dist.print0(f"[rlft] rollout engine: {why}; importance-sampling correction: {correction}"
                    + (f" ({rollout.is_level}, C={rollout.is_cap})" if correction != "none" else ""))
        experience = cls(cfg, info, tokenizer, policy, sampler=sampler, env=env, rewards=rewards, reference=reference,
                         critic=critic, step_scorer=step_scorer, is_correction=correction, teacher=teacher)
        if rollout.max_staleness:
            from rlft.rollout.async_sampler import AsyncSampler

            experience.ahead = AsyncSampler(cfg, model_path or resolve_model_path(cfg),
                                            threads=int(rollout.sampler_threads), device=info.device)
            dist.at_shutdown(experience.ahead.close)
            dist.print0(f"[rlft] asynchronous sampling: {experience.ahead.describe()}")
        return experience

    @property
    def needs(self) -> frozenset[str]:
        """The extras this run's rollouts carry (`rollout_needs`)."""
        return rollout_needs(self.cfg.algo, self.reference is not None, self.is_correction)

    @property
    def prompt_budget(self) -> int:
        """Prompt tokens that leave room for max_new_tokens in the policy's context."""
        return prompt_budget(self.policy.module, self.cfg.rollout.max_new_tokens)

    # ------------------------------------------------------------------ what iterative RL swaps
    def use_reference(self, reference) -> None:
        """The model later KL terms are measured against (iterative RL resets it to the current policy)."""
        self.reference = reference

    def scorers(self) -> dict:
        """The reward models in use by kind (rm, prm); each takes new weights through its `use`."""
        out = dict(self.rewards.models)
        if self.step_scorer is not None and not isinstance(self.step_scorer, ExactSteps):
            out["prm"] = self.step_scorer
        return out

    # ------------------------------------------------------------------ timing
    @contextmanager
    def timed(self, phase: str):
        tic = time.time()
        try:
            yield
        finally:
            self.times[phase] += time.time() - tic

    def take_times(self) -> dict[str, float]:
        """Seconds per phase since the last call (and start counting again)."""
        out, self.times = self.times, dict.fromkeys(PHASES, 0.0)
        return out

    # ------------------------------------------------------------------ sample and score
    def episodes(self, rows: list[dict], prompt_ids: list[list[int]], n: int, sampling: Sampling, seed: int):
        """n trajectories per row through the environment from the policy's current weights (synced
        into the engine first; one engine call per turn)."""
        self.sampler.sync_weights(self.policy.global_step)
        return episodes.sample(self.sampler, self.env, rows, prompt_ids, n, sampling, seed, self.tokenizer,
                               episodes.limits(self.cfg, self.env, self.tokenizer))

    def prompts(self, rows: list[dict]) -> tuple[list[str], list[list[int]]]:
        """The rows' rendered prompts and their token ids."""
        prompt_texts = [inputs.render(self.cfg, self.tokenizer, r) for r in rows]
        return prompt_texts, encode_prompts(self.tokenizer, prompt_texts, self.prompt_budget, "rollout")

    def sample(self, rows: list[dict], seed: int) -> rb.Rollout:
        """G trajectories for each row, as padded tensors (no scores yet)."""
        with self.timed("sample"):
            prompt_texts, prompt_ids = self.prompts(rows)
            gens = self.episodes(rows, prompt_ids, self.cfg.rollout.samples_per_prompt, self.sampling, seed)
            return self.to_rollout(rows, prompt_texts, prompt_ids, gens)

    def to_rollout(self, rows: list[dict], prompt_texts: list[str], prompt_ids: list[list[int]], gens) -> rb.Rollout:
        tok = self.tokenizer
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
        """Total reward and the truncation policy; step scores when the estimator needs them."""
        with self.timed("score"):
            prompts = [row["prompt"] for row in ro.rows]
            total, ro.per_source = self.rewards(prompts, ro.prompt_texts, ro.completions, ro.rows)
            reward_cfg = self.cfg.reward
            ro.scores, ro.mask = rb.apply_truncation_policy(total, ro.mask, ro.truncated, reward_cfg.truncation_policy,
                                                            reward_cfg.truncation_penalty)
            if "step_scores" in self.needs:
                probs, char_ends = self.step_scorer.steps(ro.prompt_texts, ro.completions, ro.rows)
                ro.put(step_scores=probs, step_ends=[rb.step_columns(self.tokenizer, c, e, p) if e else []
                                                     for c, e, p in zip(ro.completion_ids, char_ends, ro.prompt_lens)])

    def rank_rows(self, rollout_index: int, round_: int = 0) -> list[dict]:
        """This rank's training rows of a rollout (round > 0: dynamic sampling's extra draws): its share of the
        prompts `self.prompt_source` chooses, the same on every rank (rlft/stages/prompts.py)."""
        rows, info = self.prompt_source.select(rollout_index, round_), self.info
        mine = minibatch_shard(list(range(len(rows))), self.cfg.algo.minibatches_per_rollout, info.rank,
                               info.world_size)
        return [rows[i] for i in mine]

    def observe(self, rollout_index: int, *rollouts: rb.Rollout) -> None:
        """Collective: what the rollout's prompts scored, to the prompt source (the difficulty pool, the
        curriculum); dynamic sampling's discarded groups count too."""
        samples = [(row, reward) for ro in rollouts for row, reward in zip(ro.rows, ro.scores.tolist())]
        self.prompt_source.observe(samples, rollout_index, dist.all_gather_object)

    def sampling_seed(self, rollout_index: int, round_: int = 0) -> int:
        """The engine's sampling seed (vllm, the async sampler; hf in the trainer draws from torch's generator)."""
        return ((self.cfg.seed * 1_000_003 + rollout_index) * 31 + round_) * 4099 + self.info.rank

    def rollout(self, rollout_index: int) -> rb.Rollout:
        """Sample and score this rank's prompts; dynamic sampling refills all-equal groups."""
        if self.ahead is not None:
            return self.rollout_ahead(rollout_index)
        rollout_cfg = self.cfg.rollout
        G = rollout_cfg.samples_per_prompt
        ro = self.sample(self.rank_rows(rollout_index), self.sampling_seed(rollout_index))
        self.score(ro)
        scored = [ro]
        if rollout_cfg.dynamic_sampling:
            for round_ in range(1, rollout_cfg.max_sampling_rounds):
                keep = dynamic_sampling_keep_mask(ro.scores, G)
                if bool(keep.all()):
                    break
                extra = self.sample(self.rank_rows(rollout_index, round_), self.sampling_seed(rollout_index, round_))
                self.score(extra)
                scored.append(extra)
                ro = merge_informative(ro, extra, keep, dynamic_sampling_keep_mask(extra.scores, G), G,
                                       self.tokenizer.pad_token_id)
        self.observe(rollout_index, *scored)
        self.sampler.sleep()  # a GPU engine frees its memory for the trainer until the next sync
        return ro

    # ------------------------------------------------------------------ asynchronous sampling
    def schedule(self, rollout_index: int) -> None:
        """Before rollout r trains: send the sampler the policy's weights (version r) and ask it for every
        rollout up to r + K not yet asked, so rollout j is sampled from version max(0, j - K)."""
        ahead, version = self.ahead, rollout_index
        with self.timed("sample"):
            ahead.push(version, self.policy.named_weights())
            for j in range(rollout_index, rollout_index + ahead.max_staleness + 1):
                if j in ahead.pending:
                    continue
                rows = self.rank_rows(j)
                prompt_texts, prompt_ids = self.prompts(rows)
                ahead.ask(j, version, rows, prompt_texts, prompt_ids, self.cfg.rollout.samples_per_prompt,
                          self.sampling, self.sampling_seed(j))

    def rollout_ahead(self, rollout_index: int) -> rb.Rollout:
        """Rollout r from the sampler (sampled while earlier rollouts trained), scored here."""
        with self.timed("sample"):
            request, gens, busy_s = self.ahead.take(rollout_index)
        ro = self.to_rollout(request.rows, request.prompt_texts, request.prompt_ids, gens)
        ro.metrics.update(staleness=rollout_index - request.version, sampler_busy_s=busy_s)
        if ro.metrics["staleness"] > self.ahead.max_staleness:  # the schedule rules this out
            raise RuntimeError(f"rollout {rollout_index} came from weights version {request.version}, more than "
                               f"rollout.max_staleness={self.ahead.max_staleness} behind")
        self.score(ro)
        self.observe(rollout_index, ro)
        return ro

    # ------------------------------------------------------------------ what the update reads
    def put_logprobs(self, ro: rb.Rollout) -> torch.Tensor | None:
        """Put pi_old's, the reference's and the teacher's log-probs into the rollout where the run needs them;
        with pi_old and the engine's log-probs, their gap and the IS weights of the correction. Returns the mask
        of the tokens the correction keeps (None: all)."""
        keep, needs = None, self.needs
        with self.timed("logprobs"):
            train, rollout = self.cfg.train, self.cfg.rollout
            micro, budget = train.micro_batch_per_device, train.max_tokens_per_micro_batch
            # the distribution the engine sampled from: temperature, then its top-k and top-p truncation
            how = dict(packed=train.packing, max_tokens=budget, share_prompt=bool(train.share_prompt),
                       top_k=int(rollout.top_k), top_p=float(rollout.top_p))
            if "old_logp" in needs:
                ro.put(old_logp=rollout_logp(self.policy, ro, micro, rollout.temperature, **how))
            if "ref_logp" in needs:
                ro.put(ref_logp=rollout_logp(self.reference, ro, micro, rollout.temperature, **how))
            if "old_logp" in needs and ro.sampler_logp is not None:  # engine vs trainer: mismatch, correction
                engine_logp = rb.target_aligned(ro.sampler_logp, ro.prompt_lens, ro.mask.shape[1])
                weight, keep, measured = IS_CORRECTIONS.get(self.is_correction)(
                    ro.get("old_logp"), engine_logp, ro.mask, ISConfig(rollout.is_level, rollout.is_cap))
                ro.metrics.update(measured)
                if "is_weight" in needs:
                    ro.put(is_weight=weight)
        if "teacher_logp" in needs:  # the teacher's full distribution at the sampling temperature (no truncation)
            with self.timed("teacher"):
                ro.put(teacher_logp=rollout_logp(self.teacher, ro, micro, rollout.temperature,
                                                 **{**how, "top_k": 0, "top_p": 1.0}))
        return keep

    def values(self, ro: rb.Rollout) -> None:
        if "values" not in self.needs:
            return
        with self.timed("values"):
            train = self.cfg.train
            ro.put(values=batched_values(self.critic, ro.input_ids, ro.attention_mask,
                                         train.micro_batch_per_device, train.max_tokens_per_micro_batch, train.packing))

    def advantages(self, ro: rb.Rollout, kl_coef: float, keep: torch.Tensor | None = None) -> None:
        """The registered estimator's advantages (and returns), or a pairwise loss's pair inputs; then the
        tokens the IS correction dropped (`keep` 0) leave the mask, so the loss and its counts."""
        with self.timed("advantages"):
            algo, G = self.cfg.algo, self.cfg.rollout.samples_per_prompt
            if algo.pairwise_loss is not None:
                scores, s_ref, delta = pair_rollout_inputs(ro.scores, ro.get("old_logp"), ro.get("ref_logp"),
                                                           ro.mask, G, kl_coef)
                ro.put(pair_scores=scores, pair_s_ref=s_ref, delta=delta)
            else:
                batch = AdvantageInputs(scores=ro.scores, mask=ro.mask, group_size=G, step_ends=ro.get("step_ends"),
                                        step_scores=ro.get("step_scores"), old_logp=ro.get("old_logp"),
                                        ref_logp=ro.get("ref_logp"), values=ro.get("values"),
                                        teacher_logp=ro.get("teacher_logp"))
                out = ADVANTAGES.get(algo.advantage)(batch, advantage_config(algo, self.cfg.critic, kl_coef))
                ro.put(adv=out.adv.float(), returns=out.returns)
                if keep is not None:
                    ro.mask = keep.to(ro.mask.dtype)

    def prepare(self, ro: rb.Rollout, kl_coef: float) -> None:
        """Everything the update reads, from a scored rollout."""
        keep = self.put_logprobs(ro)
        self.values(ro)
        self.advantages(ro, kl_coef, keep)

    def collect(self, rollout_index: int, kl_coef: float) -> rb.Rollout:
        """One rollout, sampled, scored and prepared for the update."""
        ro = self.rollout(rollout_index)
        self.prepare(ro, kl_coef)
        return ro

    # ------------------------------------------------------------------ eval
    @torch.no_grad()
    def greedy_accuracy(self) -> dict:
        info, tok = self.info, self.tokenizer
        shard = self.test_rows[info.rank::info.world_size]
        prompt_ids = encode_prompts(tok, [inputs.render(self.cfg, tok, r) for r in shard], self.prompt_budget,
                                    "held-out accuracy")
        gens = self.episodes(shard, prompt_ids, 1, Sampling(self.cfg.rollout.max_new_tokens, do_sample=False), 0)
        self.sampler.sleep()
        correct = sum(s.correct for s in self.env.scores(shard, gens.texts))
        correct, total = dist.all_reduce_sum([float(correct), float(len(shard))])
        return {"eval_greedy_accuracy": correct / max(total, 1.0)}
