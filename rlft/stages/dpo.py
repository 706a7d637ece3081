"""Offline DPO (docs/algorithms.md §9): preference pairs, a frozen reference, -log sigma(h_w - h_l).

    rlft train algo=dpo run.name=demo                         # built-in pairs, from this run's SFT
    rlft train algo=dpo data=jsonl data.source=prefs.jsonl    # prompt/chosen/rejected rows
    rlft train algo=dpo algo.length_normalize=true            # DeepSeekMath Eq. 12 variant
    rlft train algo=dpo algo.source=policy                    # pairs of the SFT model's own samples

With algo.source=policy the pairs are the sampled model's own (algo.sample_from, this run's SFT by
default): `rollout.samples_per_prompt` samples of each of `algo.num_prompts` questions, checked by the
answer verifier, a correct one chosen over an incorrect one of the same question (as the RM's pairs,
docs/algorithms.md §2 and §9).

h = beta * (s_policy - s_reference), s summed over response tokens. The reference log-probs of
every training pair are computed once, before training, by the starting model (the reference),
which is then dropped: training holds one model.
"""
from __future__ import annotations

import torch

from rlft import dist
from rlft.algos.preference import dpo_loss
from rlft.data.encode import collate_padded, pad_to
from rlft.model_source import resolve_model_path
from rlft.models import load_model, load_tokenizer
from rlft.rollout.logprobs import packed_logp, token_logp
from rlft.stages import common, inputs, policy_data
from rlft.trainer import Trainer


def pair_logps(model, examples: list[dict], pad_id: int, device, packed: bool = False) -> tuple[
        torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """(s_chosen [P], s_rejected [P], len_chosen [P], len_rejected [P]): one forward over both (`packed`:
    padding-free, train.packing)."""
    seqs = [ex["chosen_ids"] for ex in examples] + [ex["rejected_ids"] for ex in examples]
    masks = [ex["chosen_mask"] for ex in examples] + [ex["rejected_mask"] for ex in examples]
    ids, attn = collate_padded(seqs, pad_id)
    mask = pad_to(masks, 0, dtype=torch.float32)[:, 1:].to(device)
    if packed:
        logp = packed_logp(model, ids.to(device), attn.to(device), mask)
    else:
        logp = token_logp(model, ids.to(device), attn.to(device), mask=mask)
    s = (logp * mask).sum(-1)
    lengths = mask.sum(-1)
    n = len(examples)
    return s[:n], s[n:], lengths[:n], lengths[n:]


@torch.no_grad()
def add_reference_logps(model, examples: list[dict], pad_id: int, micro: int, device, packed: bool = False) -> None:
    """Store the reference's sequence log-probs in each example (each rank its share, then shared)."""
    info = dist.info()
    mine = list(range(info.rank, len(examples), info.world_size))
    model.eval()
    values: dict[int, tuple[float, float]] = {}
    for start in range(0, len(mine), micro):
        idx = mine[start:start + micro]
        s_w, s_l, _, _ = pair_logps(model, [examples[i] for i in idx], pad_id, device, packed)
        values.update({i: (w, lose) for i, w, lose in zip(idx, s_w.tolist(), s_l.tolist())})
    values = {k: v for part in dist.all_gather_object(values) for k, v in part.items()}
    for i, ex in enumerate(examples):
        ex["ref_chosen"], ex["ref_rejected"] = values[i]


def dpo_step_loss(trainer: Trainer, examples: list[dict], num_pairs_global: float, pad_id: int, a, packed: bool = False):
    s_w, s_l, len_w, len_l = pair_logps(trainer, examples, pad_id, trainer.device, packed)
    ref_w = torch.tensor([ex["ref_chosen"] for ex in examples], device=trainer.device)
    ref_l = torch.tensor([ex["ref_rejected"] for ex in examples], device=trainer.device)
    loss, m = dpo_loss(s_w, s_l, ref_w, ref_l, a.beta, a.length_normalize, len_w, len_l)
    n = float(len(examples))
    stats = {"loss": (loss.sum().item(), n), "reward_acc": (m["accuracy"].item() * n, n),
             "margin": (m["margin"].item() * n, n), "chosen_reward": (m["chosen_reward"].item() * n, n),
             "rejected_reward": (m["rejected_reward"].item() * n, n)}
    return loss.sum() / num_pairs_global, stats


def run(cfg, ctx: common.StageContext) -> dict:
    common.prepare_run_dir(ctx)
    algo = cfg.algo
    parent = resolve_model_path(cfg)
    tokenizer = load_tokenizer(cfg.model, parent)
    pad = tokenizer.pad_token_id
    common.seed_everything(cfg.seed)
    train, test, sampled = pairs(cfg, tokenizer, ctx.info.device)
    if not train:
        raise common.StageError(f"dpo: no training pairs (from {algo.source}); with algo.source=policy the sampled "
                                "model needs both correct and incorrect samples of a question: raise "
                                "rollout.samples_per_prompt or algo.num_prompts")
    model = load_model(cfg.model, parent, tokenizer, seed=cfg.seed, trained=True).to(ctx.info.device)
    micro = cfg.train.micro_batch_per_device
    packed = cfg.train.packing
    add_reference_logps(model, train + test, pad, micro, ctx.info.device, packed)
    model.train()
    dist.print0(f"dpo: {len(train)} training and {len(test)} held-out pairs; reference log-probs cached")
    trainer = Trainer(cfg, model)
    loss_fn = lambda e, x, d: dpo_step_loss(e, x, d, pad, algo, packed)  # noqa: E731
    evaluate = (lambda: common.held_out(trainer, test, loss_fn, micro)) if test else None
    summary = common.supervised_loop(ctx, trainer, train, len, loss_fn, evaluate, algo.eval_every)
    summary.update(sampled, train_pairs=len(train))
    common.finish(ctx, trainer, tokenizer, parent, summary)
    return summary


def pairs(cfg, tokenizer, device) -> tuple[list[dict], list[dict], dict]:
    """(training pairs, held-out pairs, what was sampled): the data's pairs, or the sampled model's own."""
    algo = cfg.algo
    if algo.source == "policy":
        train, train_info = policy_data.pair_examples(cfg, tokenizer, "train", algo.num_prompts, device)
        test, test_info = policy_data.pair_examples(cfg, tokenizer, "test", algo.num_eval_pairs, device)
        return train, test[:algo.num_eval_pairs], train_info | test_info
    return (inputs.pair_examples(cfg, tokenizer, "train"),
            inputs.pair_examples(cfg, tokenizer, "test")[:algo.num_eval_pairs], {})
