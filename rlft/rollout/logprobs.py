"""Per-token log-probs of sampled sequences, without a full-vocabulary fp32 log-softmax.

Token tensors here are aligned to *targets*: column p holds the log-prob of token p+1 given
tokens 0..p (the logit at position p predicts the next token). A response mask in the same
alignment marks the completion tokens up to and including the first EOS.
"""
from __future__ import annotations

import torch


CHUNK_BYTES = 2**29  # fp32 logits upcast at a time by selective_logp and the entropy (512 MiB)


def chunk_rows(logits: torch.Tensor) -> int:
    """How many rows of logits [B, T, V] fit in CHUNK_BYTES as fp32 (at least one)."""
    return max(1, CHUNK_BYTES // max(1, logits[0].numel() * 4))


def selective_logp(logits: torch.Tensor, targets: torch.Tensor, rows_per_chunk: int | None = None) -> torch.Tensor:
    """log softmax(logits)[target] per position, [B, T] fp32.

    `rows_per_chunk` rows are upcast to fp32 at a time (default: as many as fit in CHUNK_BYTES), so a
    large vocabulary's fp32 logits never exist for the whole batch at once; a small one takes the
    batch in one piece."""
    rows = rows_per_chunk or chunk_rows(logits)
    out = []
    for lg, tg in zip(logits.split(rows), targets.split(rows)):
        lg = lg.float()
        picked = lg.gather(-1, tg.unsqueeze(-1)).squeeze(-1)
        out.append(picked - torch.logsumexp(lg, dim=-1))
    return torch.cat(out)


def response_start(mask: torch.Tensor) -> int:
    """First target column where any row has a response token (0 when none has): the columns
    before it are prompt in every row and need no logits."""
    cols = mask.bool().any(0).nonzero()
    return int(cols[0]) if len(cols) else 0


def forward_logits(model, input_ids: torch.Tensor, attention_mask: torch.Tensor, start: int = 0,
                   temperature: float = 1.0) -> torch.Tensor:
    """Next-token logits [B, L-1-start] for target columns start..L-2 (positions start..L-2).

    The LM head runs only on those positions (`logits_to_keep`), which on a large vocabulary
    saves the prompt's share of its time and of the logits' memory."""
    keep = input_ids.shape[1] - start
    kwargs = {"logits_to_keep": keep} if start > 0 else {}
    logits = model(input_ids=input_ids, attention_mask=attention_mask, **kwargs).logits[:, -keep:][:, :-1]
    return logits / temperature if temperature != 1.0 else logits


def token_logp(model, input_ids: torch.Tensor, attention_mask: torch.Tensor,
               temperature: float = 1.0, start: int = 0) -> torch.Tensor:
    """Log-probs [B, L-1] of input_ids[:, 1:] under `model` (grad flows if enabled); columns
    before `start` (prompt only) are left at 0 without computing their logits.

    `temperature` divides the logits as sampling did, so old/ref/current log-probs all refer
    to the same distribution the tokens were drawn from."""
    logits = forward_logits(model, input_ids, attention_mask, start, temperature)
    logp = selective_logp(logits, input_ids[:, start + 1:])
    if start == 0:
        return logp
    return torch.cat([logp.new_zeros(logp.shape[0], start), logp], 1)


@torch.no_grad()
def batched_token_logp(model, input_ids: torch.Tensor, attention_mask: torch.Tensor, micro_batch: int,
                       temperature: float = 1.0, mask: torch.Tensor | None = None) -> torch.Tensor:
    """token_logp over a large batch in micro-batches, no grad (old and reference log-probs).
    With the response `mask`, each micro-batch skips the logits of its all-prompt columns."""
    out = []
    for k, (ids, attn) in enumerate(zip(input_ids.split(micro_batch), attention_mask.split(micro_batch))):
        start = response_start(mask[k * micro_batch:(k + 1) * micro_batch]) if mask is not None else 0
        out.append(token_logp(model, ids, attn, temperature, start))
    return torch.cat(out)
