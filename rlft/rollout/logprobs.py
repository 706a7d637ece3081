"""Per-token log-probs of sampled sequences, without a full-vocabulary fp32 log-softmax.

Token tensors here are aligned to *targets*: column p holds the log-prob of token p+1 given
tokens 0..p (the logit at position p predicts the next token). A response mask in the same
alignment marks the completion tokens up to and including the first EOS.
"""
from __future__ import annotations

import torch


def selective_logp(logits: torch.Tensor, targets: torch.Tensor, rows_per_chunk: int = 4) -> torch.Tensor:
    """log softmax(logits)[target] per position, [B, T] fp32.

    Only `rows_per_chunk` rows are upcast to fp32 at a time, so peak memory is
    rows_per_chunk x T x V floats instead of B x T x V."""
    out = []
    for lg, tg in zip(logits.split(rows_per_chunk), targets.split(rows_per_chunk)):
        lg = lg.float()
        picked = lg.gather(-1, tg.unsqueeze(-1)).squeeze(-1)
        out.append(picked - torch.logsumexp(lg, dim=-1))
    return torch.cat(out)


def token_logp(model, input_ids: torch.Tensor, attention_mask: torch.Tensor,
               temperature: float = 1.0) -> torch.Tensor:
    """Log-probs [B, L-1] of input_ids[:, 1:] under `model` (grad flows if enabled).

    `temperature` divides the logits as sampling did, so old/ref/current log-probs all refer
    to the same distribution the tokens were drawn from."""
    logits = model(input_ids=input_ids, attention_mask=attention_mask).logits[:, :-1]
    if temperature != 1.0:
        logits = logits / temperature
    return selective_logp(logits, input_ids[:, 1:])


@torch.no_grad()
def batched_token_logp(model, input_ids: torch.Tensor, attention_mask: torch.Tensor, micro_batch: int,
                       temperature: float = 1.0) -> torch.Tensor:
    """token_logp over a large batch in micro-batches, no grad (old and reference log-probs)."""
    out = [token_logp(model, ids, attn, temperature)
           for ids, attn in zip(input_ids.split(micro_batch), attention_mask.split(micro_batch))]
    return torch.cat(out)
