"""Offline RFT (rejection-sampling fine-tuning, DeepSeekMath §5.2.1): sample once, keep, fine-tune.

    rlft train algo=rft run.name=demo

1. sample `rollout.samples_per_prompt` completions for each of `algo.num_prompts` training prompts
   from the starting (SFT) model;
2. keep the completions whose reward exceeds `algo.rft_threshold` (default reward: the rule
   verifier), de-duplicated per prompt;
3. fine-tune on them with the SFT loss (gradient coefficient 1 on kept samples, 0 elsewhere).
"""
from __future__ import annotations

import functools

import torch

from rlft import dist, envs
from rlft.data.encode import encode_prompts, prompt_budget
from rlft.envs import episodes
from rlft.model_source import resolve_model_path
from rlft.models import load_model, load_tokenizer
from rlft.rewards.scoring import RewardSet
from rlft.rollout.generate import Frozen, Sampling, build_engine
from rlft.stages import common, inputs
from rlft.stages.sft import loss_kernel, response_token_count, sft_loss
from rlft.trainer import Trainer


def dedupe(samples: list[tuple]) -> list[tuple]:
    """Distinct samples (prompt index, completion, ...), first occurrence kept, order preserved."""
    seen, out = set(), []
    for key in samples:
        if key not in seen:
            seen.add(key)
            out.append(key)
    return out


def collect(cfg, ctx, model, tokenizer) -> tuple[list[dict], dict]:
    """Sampled, verified and de-duplicated trajectories as SFT examples (the sampled tokens themselves,
    environment tokens untrained), the same on every rank."""
    algo, info = cfg.algo, ctx.info
    env = envs.build(cfg, tokenizer)
    rows = env.rows("train")
    rows = rows[:algo.num_prompts] if algo.num_prompts else rows
    mine = list(range(info.rank, len(rows), info.world_size))
    prompt_texts = [inputs.render(cfg, tokenizer, rows[i]) for i in mine]
    rollout = cfg.rollout
    prompt_ids = encode_prompts(tokenizer, prompt_texts, prompt_budget(model, rollout.max_new_tokens), "rft")
    engine, why = build_engine(cfg, Frozen(model), tokenizer, info.device, seed=cfg.seed)
    dist.print0(f"[rlft] rollout engine: {why}")
    engine.sync_weights(0)
    torch.manual_seed(cfg.seed + info.rank)
    gens = episodes.sample(engine, env, [rows[i] for i in mine], prompt_ids, rollout.samples_per_prompt,
                           Sampling.of_rollout(rollout), cfg.seed * 1000 + info.rank, tokenizer,
                           episodes.limits(cfg, env, tokenizer))
    engine.sleep()
    owners = [mine[j] for j in gens.prompt_index]
    rewards, _ = RewardSet(cfg, info.device, env)([rows[i]["prompt"] for i in owners],
                                                   [prompt_texts[j] for j in gens.prompt_index], gens.texts,
                                                   [rows[i] for i in owners])
    weights = gens.token_mask or [[1] * len(c) for c in gens.completion_ids]
    kept = [(i, tuple(c), tuple(w), j) for i, c, w, j, rew, trunc in
            zip(owners, gens.completion_ids, weights, gens.prompt_index, rewards.tolist(), gens.truncated)
            if rew > algo.rft_threshold and not trunc]
    local = [(i, c, w, tuple(prompt_ids[j])) for i, c, w, j in kept]
    samples = dedupe(sorted(s for part in dist.all_gather_object(local) for s in part))
    n_sampled, n_kept = dist.all_reduce_sum([float(len(gens.texts)), float(len(kept))])
    stats = {"rft_sampled": n_sampled, "rft_correct": n_kept, "rft_unique": len(samples),
             "rft_prompt_coverage": len({s[0] for s in samples}) / max(len(rows), 1)}
    return [example(list(p), list(c), list(w), cfg.train.max_seq_len) for _, c, w, p in samples], stats


def example(prompt_ids: list[int], completion_ids: list[int], weights: list[int], max_len: int) -> dict:
    """An SFT example of a sampled trajectory: its tokens as sampled, the loss on the model's tokens."""
    ids, mask = prompt_ids + completion_ids, [0] * len(prompt_ids) + weights
    return {"input_ids": ids[:max_len], "loss_mask": mask[:max_len], "truncated": len(ids) > max_len}


def run(cfg, ctx: common.StageContext) -> dict:
    common.prepare_run_dir(ctx)
    parent = resolve_model_path(cfg)
    tokenizer = load_tokenizer(cfg.model, parent)
    common.seed_everything(cfg.seed)
    model = load_model(cfg.model, parent, tokenizer, seed=cfg.seed, trained=True).to(ctx.info.device)
    samples, stats = collect(cfg, ctx, model, tokenizer)
    dist.print0(f"rft: {stats}")
    if not samples:
        raise common.StageError("rft: no sampled completion passed the verifier; raise rollout.samples_per_prompt "
                           "or start from a stronger model")
    examples = samples
    trainer = Trainer(cfg, model)
    summary = common.supervised_loop(ctx, trainer, examples, response_token_count,
                                     functools.partial(sft_loss, pad_id=tokenizer.pad_token_id,
                                                       packed=cfg.train.packing, kernel=loss_kernel(cfg)))
    summary.update(stats)
    common.finish(ctx, trainer, tokenizer, parent, summary)
    return summary
