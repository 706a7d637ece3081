"""Offline RFT (rejection-sampling fine-tuning, DeepSeekMath §5.2.1): sample once, keep, fine-tune.

    rlft train algo=rft run.name=demo

1. sample `rollout.samples_per_prompt` completions for each of `algo.num_prompts` training prompts
   from the starting (SFT) model;
2. keep the completions whose reward exceeds `algo.rft_threshold` (default reward: the rule
   verifier), de-duplicated per prompt;
3. fine-tune on them with the SFT loss (gradient coefficient 1 on kept samples, 0 elsewhere).
"""
from __future__ import annotations

import torch

from rlft import handoff
from rlft.data.encode import encode_prompts, encode_sft, prompt_budget
from rlft.engine import Engine, dist
from rlft.models import load_model, load_tokenizer
from rlft.rewards.scoring import RewardSet
from rlft.rollout.generate import Frozen, Sampling, build_engine
from rlft.stages import common, inputs
from rlft.stages.sft import response_token_count, sft_loss


def dedupe(samples: list[tuple[int, str]]) -> list[tuple[int, str]]:
    """Distinct (prompt index, completion) pairs, first occurrence kept, order preserved."""
    seen, out = set(), []
    for key in samples:
        if key not in seen:
            seen.add(key)
            out.append(key)
    return out


def collect(cfg, ctx, model, tokenizer) -> tuple[list[tuple[int, str]], dict]:
    """Sampled, verified and de-duplicated (prompt index, completion) pairs, the same on every rank."""
    a, info = cfg.algo, ctx.info
    rows = inputs.qa_rows(cfg, "train")
    rows = rows[:a.num_prompts] if a.num_prompts else rows
    mine = list(range(info.rank, len(rows), info.world_size))
    prompt_texts = [inputs.render(cfg, tokenizer, rows[i]["prompt"]) for i in mine]
    r = cfg.rollout
    engine, why = build_engine(cfg, Frozen(model), tokenizer, info.device, seed=cfg.seed)
    dist.print0(f"[rlft] rollout engine: {why}")
    engine.sync_weights(0)
    torch.manual_seed(cfg.seed + info.rank)
    gens = engine.generate(encode_prompts(tokenizer, prompt_texts, prompt_budget(model, r.max_new_tokens), "rft"),
                           r.samples_per_prompt,
                           Sampling(r.max_new_tokens, True, r.temperature, r.top_p, r.top_k),
                           seed=cfg.seed * 1000 + info.rank)
    engine.sleep()
    owners = [mine[j] for j in gens.prompt_index]
    rewards, _ = RewardSet(cfg, info.device)([rows[i]["prompt"] for i in owners],
                                              [prompt_texts[j] for j in gens.prompt_index], gens.texts,
                                              [rows[i] for i in owners])
    kept = [(i, t) for i, t, r, trunc in zip(owners, gens.texts, rewards.tolist(), gens.truncated)
            if r > a.rft_threshold and not trunc]
    samples = dedupe(sorted(s for part in dist.all_gather_object(kept) for s in part))
    n_sampled, n_kept = dist.all_reduce_sum([float(len(gens.texts)), float(len(kept))])
    stats = {"rft_sampled": n_sampled, "rft_correct": n_kept, "rft_unique": len(samples),
             "rft_prompt_coverage": len({i for i, _ in samples}) / max(len(rows), 1)}
    return [(rows[i], t) for i, t in samples], stats


def run(cfg, ctx: common.StageContext) -> dict:
    common.prepare_run_dir(ctx)
    parent = handoff.resolve_model_path(cfg)
    tokenizer = load_tokenizer(cfg.model, parent)
    common.seed_everything(cfg.seed)
    model = load_model(cfg.model, parent, tokenizer, seed=cfg.seed, trained=True).to(ctx.info.device)
    samples, stats = collect(cfg, ctx, model, tokenizer)
    dist.print0(f"rft: {stats}")
    if not samples:
        raise common.StageError("rft: no sampled completion passed the verifier; raise rollout.samples_per_prompt "
                           "or start from a stronger model")
    examples = [encode_sft(tokenizer, inputs.render(cfg, tokenizer, row["prompt"]), text, cfg.train.max_seq_len)
                for row, text in samples]
    engine = Engine(cfg, model)
    summary = common.supervised_loop(ctx, engine, examples, response_token_count,
                                     lambda e, x, d: sft_loss(e, x, d, tokenizer.pad_token_id, cfg.train.packing))
    summary.update(stats)
    common.finish(ctx, engine, tokenizer, parent, summary)
    return summary
