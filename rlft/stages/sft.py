"""SFT: next-token cross-entropy on response tokens only (prompt tokens are context, not targets).

    rlft train algo=sft run.name=demo            # built-in tiny model on the built-in task
    rlft train algo=sft model=hf model.path=Qwen/Qwen2.5-0.5B-Instruct data=gsm8k

The loss is the token-mean over every response token of the optimizer step (all micro-batches,
all ranks), so the update is the same whatever the micro-batch size or number of ranks.
"""
from __future__ import annotations

import functools
from typing import Callable

import torch

from rlft import dist
from rlft.data.encode import collate_padded, pad_to
from rlft.model_source import resolve_model_path
from rlft.models import load_model, load_tokenizer
from rlft.rollout.lm_head import TokenLoss
from rlft.rollout.logprobs import packed_logp, response_start, token_logp
from rlft.stages import common, inputs
from rlft.trainer import Trainer


def response_token_count(examples: list[dict]) -> int:
    """Tokens that carry loss: the shifted mask drops each sequence's first position."""
    return sum(sum(ex["loss_mask"][1:]) for ex in examples)


def sft_loss(trainer: Trainer, examples: list[dict], num_tokens_global: float, pad_id: int, packed: bool = False,
             kernel: Callable | None = None):
    """Sum of response-token cross-entropy in this micro-batch / tokens in the whole step (`packed`: one
    padding-free forward, train.packing; `kernel`: liger-kernel's fused cross-entropy, `loss_kernel`)."""
    ids, attn = collate_padded([ex["input_ids"] for ex in examples], pad_id)
    mask = pad_to([ex["loss_mask"] for ex in examples], 0)
    ids, attn, mask = ids.to(trainer.device), attn.to(trainer.device), mask.to(trainer.device)
    target_mask = mask[:, 1:].float()
    loss = TokenLoss(token_nll, {"weight": target_mask / num_tokens_global}, kernel)
    if packed:
        logp, extra, value = packed_logp(trainer, ids, attn, target_mask, extras=("top1",), loss=loss)
    else:  # the LM head only at response tokens, a chunk at a time
        logp, extra, value = token_logp(trainer, ids, attn, start=response_start(target_mask), mask=target_mask,
                                        extras=("top1",), loss=loss)
    nll_sum = -(logp * target_mask).sum()
    correct = (extra["top1"] * target_mask).sum()
    count = target_mask.sum()
    stats = {"loss": (nll_sum.item(), count.item()), "token_acc": (correct.item(), count.item())}
    return value, stats


def loss_kernel(cfg) -> Callable | None:
    """SFT's and RFT's TokenLoss.kernel: liger-kernel's fused cross-entropy with train.fused_loss=liger, else None."""
    if str(cfg.train.fused_loss) != "liger":
        return None
    from rlft.rollout.liger import nll_kernel

    return nll_kernel()


def token_nll(logp: torch.Tensor, inputs: dict, _divergence=None) -> torch.Tensor:
    """Each response token's negative log-likelihood over the step's token count (lm_head.TokenLoss.fn: the
    head differentiates it chunk by chunk in the forward)."""
    return -logp * inputs["weight"]


def run(cfg, ctx: common.StageContext) -> dict:
    common.prepare_run_dir(ctx)
    parent = resolve_model_path(cfg)
    tokenizer = load_tokenizer(cfg.model, parent)
    common.seed_everything(cfg.seed)
    model = load_model(cfg.model, parent, tokenizer, head="causal_lm", seed=cfg.seed, trained=True)
    train = inputs.sft_examples(cfg, tokenizer, "train")
    dist.print0(f"sft: {len(train)} training examples, "
                f"{sum(ex['truncated'] for ex in train)} truncated at train.max_seq_len={cfg.train.max_seq_len}")
    test = inputs.sft_examples(cfg, tokenizer, "test")[:256]
    trainer = Trainer(cfg, model)

    loss_fn = functools.partial(sft_loss, pad_id=tokenizer.pad_token_id, packed=cfg.train.packing,
                                kernel=loss_kernel(cfg))
    evaluate = (lambda: common.held_out(trainer, test, loss_fn, cfg.train.micro_batch_per_device)) if test else None
    summary = common.supervised_loop(ctx, trainer, train, response_token_count, loss_fn, evaluate=evaluate)
    common.finish(ctx, trainer, tokenizer, parent, summary)
    return summary
