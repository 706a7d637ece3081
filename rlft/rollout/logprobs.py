"""Per-token log-probs of sampled sequences, without a full-vocabulary fp32 log-softmax.

Token tensors here are aligned to *targets*: column p holds the log-prob of token p+1 given
tokens 0..p (the logit at position p predicts the next token). A response mask in the same
alignment marks the completion tokens up to and including the first EOS.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from rlft.errors import ConfigError
from rlft.rollout.lm_head import (TeacherTerm, TokenLoss, cache_kwargs, chunk_tokens_of, entropy_of, head_logp,
                                  head_loss, hidden_forward, output_cache, truncate)

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
    """The model's own next-token logits [B, L-1-start] for target columns start..L-2 (positions start..L-2),
    all at once (train.logit_chunk_tokens=0; token_logp's default path never makes them).

    The LM head runs only on those positions (`logits_to_keep`), which on a large vocabulary
    saves the prompt's share of its time and of the logits' memory."""
    keep = input_ids.shape[1] - start
    kwargs = {"logits_to_keep": keep} if start > 0 else {}
    logits = model(input_ids=input_ids, attention_mask=attention_mask, use_cache=False,
                   **kwargs).logits[:, -keep:][:, :-1]
    return logits / temperature if temperature != 1.0 else logits


def forward_hidden(model, input_ids: torch.Tensor, attention_mask: torch.Tensor, start: int = 0) -> torch.Tensor:
    """Final hidden states [B, L-1-start, H] at positions start..L-2: what the LM head turns into the logits
    of target columns start..L-2 (lm_head.hidden_forward)."""
    hidden, _ = hidden_forward(model, input_ids=input_ids, attention_mask=attention_mask, use_cache=False)
    return hidden[:, start:-1]


def prompt_runs(input_ids: torch.Tensor, prompt_lens: list[int]) -> list[int]:
    """How many consecutive rows share each prompt (a group's completions of one prompt sit together)."""
    counts: list[int] = []
    for i, n in enumerate(prompt_lens):
        same = i > 0 and n == prompt_lens[i - 1] and torch.equal(input_ids[i, :n], input_ids[i - 1, :n])
        if same:
            counts[-1] += 1
        else:
            counts.append(1)
    return counts


def shared_prompt_states(model, forward, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                         prompt_lens: list[int], start: int = 0) -> torch.Tensor:
    """Per-position states [B, L-1-start, D] of right-padded prompt + completion rows (column c: what predicts
    token c + 1), each distinct prompt run once; `forward(**inputs)` runs `model` and gives (states [b, t, D],
    the model's output): the model's logits or its final hidden states.

    Rows whose prompt is the same (a group's G completions) share one forward of that prompt: its keys and
    values (transformers' KV cache, gradients flowing through it) are repeated for each of its rows, and the
    completions run after them at their own positions. The state that predicts a completion's first token is
    the prompt's last; the others come from the completion forward. On a short completion after a long
    prompt this computes about 1/G of the positions. Columns before a row's last prompt position (prompt
    targets, never in a response mask) are 0. Equal to one forward of the whole rows up to floating-point
    order."""
    from transformers import DynamicCache

    dev, (B, L) = input_ids.device, input_ids.shape
    counts = prompt_runs(input_ids, prompt_lens)
    heads = torch.tensor([0] + list(torch.tensor(counts).cumsum(0)[:-1]), device=dev)
    lens = torch.tensor(prompt_lens, device=dev)
    p_len = lens[heads]
    width = int(p_len.max())
    prompt_mask = (torch.arange(width, device=dev)[None] < p_len[:, None]).long()
    prompt_ids = input_ids[heads, :width] * prompt_mask
    cache = DynamicCache()  # its layers are made as the prompt forward fills them
    states, out = forward(input_ids=prompt_ids, attention_mask=prompt_mask, use_cache=True,
                          **cache_kwargs(model, cache))
    expand = torch.repeat_interleave(torch.arange(len(counts), device=dev), torch.tensor(counts, device=dev))
    last = states[torch.arange(len(counts), device=dev), p_len - 1][expand]  # [B, D]: predicts token p
    cache = output_cache(out)
    cache.batch_select_indices(expand)
    tail = int((L - lens).max())  # the longest completion part (to the padded width)
    offsets = torch.arange(tail, device=dev)[None]
    cols = (lens[:, None] + offsets).clamp(max=L - 1)
    inside = (lens[:, None] + offsets) < L
    comp_ids = input_ids.gather(1, cols) * inside
    comp_mask = attention_mask.gather(1, cols) * inside
    full_mask = torch.cat([prompt_mask[expand], comp_mask.long()], 1)
    comp, _ = forward(input_ids=comp_ids, attention_mask=full_mask, position_ids=lens[:, None] + offsets,
                      use_cache=False, **cache_kwargs(model, cache))  # [B, tail, D]: predicts token p + j + 1
    source = torch.cat([last[:, None], comp], 1)  # index k predicts token p + k (target column p - 1 + k)
    target_cols = torch.arange(start, L - 1, device=dev)[None]
    k = target_cols - (lens[:, None] - 1)
    valid = (k >= 0) & (k <= tail)
    picked = source.gather(1, k.clamp(0, tail)[..., None].expand(-1, -1, source.shape[-1]))
    return picked * valid[..., None]


def shared_prompt_logits(model, input_ids: torch.Tensor, attention_mask: torch.Tensor, prompt_lens: list[int],
                         start: int = 0, temperature: float = 1.0) -> torch.Tensor:
    """`forward_logits` with each distinct prompt run once (`shared_prompt_states` of the model's logits)."""
    def forward(**inputs):
        out = model(**inputs)
        return out.logits, out
    logits = shared_prompt_states(model, forward, input_ids, attention_mask, prompt_lens, start)
    return logits / temperature if temperature != 1.0 else logits


def token_logp(model, input_ids: torch.Tensor, attention_mask: torch.Tensor, temperature: float = 1.0,
               start: int = 0, prompt_lens: list[int] | None = None, mask: torch.Tensor | None = None,
               extras: tuple[str, ...] = (), top_k: int = 0, top_p: float = 1.0, term: TeacherTerm | None = None,
               loss: TokenLoss | None = None):
    """Log-probs [B, L-1] of input_ids[:, 1:] under `model` (grad flows if enabled); columns before `start`
    (prompt only) and, with a target-aligned `mask` [B, L-1], the columns outside it are left at 0 without
    computing their logits. With `prompt_lens`, each distinct prompt runs once (`shared_prompt_states`).
    `extras` (lm_head.EXTRAS) add [B, L-1] fp32 tensors without grad; then the result is (log-probs, {name:
    tensor}). With a teacher `term` the teacher's forward runs the same way (no grad) and the extras gain
    "divergence" [B, L-1] with grad (lm_head.head_logp).

    The LM head runs a chunk of tokens at a time (lm_head.head_logp; train.logit_chunk_tokens=0: the model's
    own logits, all at once). `temperature` divides the logits and `top_k`/`top_p` truncate them as sampling
    did (lm_head.truncate), so old/ref/current log-probs all refer to the distribution the tokens were drawn
    from.

    With a `loss` (a sum of per-token terms, lm_head.TokenLoss; its inputs [B, L-1]) the result is (log-probs
    without grad, extras, the loss with grad), the loss's head gradients computed chunk by chunk in the forward
    (lm_head.head_loss)."""
    B, L = input_ids.shape
    targets = input_ids[:, start + 1:]
    wants = bool(extras) or term is not None
    where = (mask[:, start:] if mask is not None else torch.ones_like(targets)).bool().nonzero(as_tuple=True)
    loss_inputs = {name: x[:, start:][where] for name, x in loss.inputs.items()} if loss is not None else {}
    if chunk_tokens_of(model) == 0:
        if term is not None:
            raise ConfigError("a full-distribution distillation divergence needs train.logit_chunk_tokens > 0")
        logits = forward_logits(model, input_ids, attention_mask, start, temperature) if prompt_lens is None else \
            shared_prompt_logits(model, input_ids, attention_mask, prompt_lens, start, temperature)
        if top_k > 0 or top_p < 1.0:
            logits = truncate(logits.float().flatten(0, 1), targets.flatten(), top_k, top_p).view(logits.shape)
        logp, more = selective_logp(logits, targets), logits_extras(logits.detach(), targets, extras)
        if mask is not None:
            keep = mask[:, start:].to(logp.dtype)
            logp, more = logp * keep, {name: value * keep for name, value in more.items()}
        if loss is not None:
            value = loss.fn(logp[where], loss_inputs, None).sum()
    else:
        def states(of):
            if prompt_lens is None:
                return forward_hidden(of, input_ids, attention_mask, start)
            return shared_prompt_states(of, lambda **inputs: hidden_forward(of, **inputs), input_ids, attention_mask,
                                        prompt_lens, start)
        hidden = states(model)
        teacher_hidden = None
        if term is not None:
            with torch.no_grad():
                teacher_hidden = states(term.teacher)[where]
        if loss is not None:
            value, picked, more = head_loss(model, hidden[where], targets[where], loss.fn, loss_inputs, temperature,
                                            extras, top_k=top_k, top_p=top_p, term=term, teacher_hidden=teacher_hidden,
                                            kernel=loss.kernel)
        else:
            picked = head_logp(model, hidden[where], targets[where], temperature, extras, top_k=top_k, top_p=top_p,
                               term=term, teacher_hidden=teacher_hidden)
            picked, more = picked if wants else (picked, {})
        logp = picked.new_zeros(B, L - 1 - start).index_put(where, picked)
        more = {name: picked.new_zeros(B, L - 1 - start).index_put(where, value) for name, value in more.items()}
    if start > 0:
        logp = torch.cat([logp.new_zeros(B, start), logp], 1)
        more = {name: torch.cat([value.new_zeros(B, start), value], 1) for name, value in more.items()}
    if loss is not None:
        return logp.detach(), more, value
    return (logp, more) if wants else logp


def logits_extras(logits: torch.Tensor, targets: torch.Tensor, extras: tuple[str, ...]) -> dict[str, torch.Tensor]:
    """lm_head.EXTRAS of whole logits [..., V] (no grad), a CHUNK_BYTES of fp32 rows at a time."""
    out = {}
    with torch.no_grad():
        if "entropy" in extras:
            rows = chunk_rows(logits)
            out["entropy"] = torch.cat([entropy_of(lg.float(), torch.logsumexp(lg.float(), -1))
                                        for lg in logits.split(rows)])
        if "top1" in extras:
            out["top1"] = (logits.argmax(-1) == targets).float()
    return out


@torch.no_grad()
def batched_token_logp(model, input_ids: torch.Tensor, attention_mask: torch.Tensor, micro_batch: int,
                       temperature: float = 1.0, mask: torch.Tensor | None = None, top_k: int = 0,
                       top_p: float = 1.0) -> torch.Tensor:
    """token_logp over a large batch in micro-batches, no grad (old and reference log-probs).
    With the response `mask`, each micro-batch computes log-probs only there (0 elsewhere)."""
    out = []
    for k, (ids, attn) in enumerate(zip(input_ids.split(micro_batch), attention_mask.split(micro_batch))):
        part = mask[k * micro_batch:(k + 1) * micro_batch] if mask is not None else None
        start = response_start(part) if part is not None else 0
        out.append(token_logp(model, ids, attn, temperature, start, mask=part, top_k=top_k, top_p=top_p))
    return torch.cat(out)


# ----------------------------------------------------------------------------- padding-free packing
@dataclass
class Packed:
    """A padded batch's real tokens in one row: positions restart at 0 for every sequence, which
    transformers reads as sequence boundaries (each token attends only within its own sequence)."""
    input_ids: torch.Tensor  # [1, N]
    position_ids: torch.Tensor  # [1, N]
    rows: torch.Tensor  # [N] the padded row of each token
    cols: torch.Tensor  # [N] its padded column
    shape: tuple[int, int]  # the padded [B, L]


def pack(input_ids: torch.Tensor, attention_mask: torch.Tensor) -> Packed:
    """Pack the attended tokens of a padded batch (either padding side) into one row."""
    rows, cols = attention_mask.bool().nonzero(as_tuple=True)
    positions = (attention_mask.long().cumsum(-1) - 1)[rows, cols]
    return Packed(input_ids[rows, cols][None], positions[None], rows, cols, tuple(input_ids.shape))


def padding_fraction(attention_mask: torch.Tensor) -> float:
    """Share of a padded batch's positions that are padding (what packing saves)."""
    return 1.0 - float(attention_mask.sum()) / max(attention_mask.numel(), 1)


def packed_logp(model, input_ids: torch.Tensor, attention_mask: torch.Tensor, mask: torch.Tensor,
                temperature: float = 1.0, extras: tuple[str, ...] = (), top_k: int = 0, top_p: float = 1.0,
                term: TeacherTerm | None = None, loss: TokenLoss | None = None):
    """Per-token log-probs [B, L-1] (target-aligned, 0 outside `mask`) from one packed forward: no
    padding is computed, and the LM head runs only where the target is a masked (response) token.
    Equal to `token_logp` on the padded batch up to floating-point order. `extras` adds, no grad,
    [B, L-1] tensors: "entropy" (of the token distribution), "top1" (1 where the target is the argmax);
    then the result is (log-probs, {name: tensor}); a teacher `term` adds "divergence" (with grad), and a `loss`
    makes the result (log-probs without grad, extras, the loss with grad), as in `token_logp`."""
    p = pack(input_ids, attention_mask)
    wants = bool(extras) or term is not None
    B, L = p.shape
    same_row = p.rows[1:] == p.rows[:-1]  # token j+1 continues the sequence of token j
    target_col = p.cols[:-1].clamp(max=L - 2)
    keep = (same_row & mask.bool()[p.rows[:-1], target_col]).nonzero().squeeze(1)
    targets = p.input_ids[0, keep + 1]
    inputs = dict(input_ids=p.input_ids, position_ids=p.position_ids, use_cache=False)
    where = (p.rows[keep], p.cols[keep])
    loss_inputs = {name: x[where] for name, x in loss.inputs.items()} if loss is not None else {}
    if chunk_tokens_of(model) == 0:
        if term is not None:
            raise ConfigError("a full-distribution distillation divergence needs train.logit_chunk_tokens > 0")
        logits = model(**inputs, logits_to_keep=keep).logits[0]  # [K, V]
        if temperature != 1.0:
            logits = logits / temperature
        if top_k > 0 or top_p < 1.0:
            logits = truncate(logits.float(), targets, top_k, top_p)
        picked = selective_logp(logits.unsqueeze(1), targets.unsqueeze(1)).squeeze(1)
        more = logits_extras(logits.detach(), targets, extras)
        if loss is not None:
            value = loss.fn(picked, loss_inputs, None).sum()
    else:
        hidden, _ = hidden_forward(model, **inputs)
        teacher_hidden = None
        if term is not None:
            with torch.no_grad():
                teacher_hidden = hidden_forward(term.teacher, **inputs)[0][0, keep]
        if loss is not None:
            value, picked, more = head_loss(model, hidden[0, keep], targets, loss.fn, loss_inputs, temperature, extras,
                                            top_k=top_k, top_p=top_p, term=term, teacher_hidden=teacher_hidden,
                                            kernel=loss.kernel)
        else:
            picked = head_logp(model, hidden[0, keep], targets, temperature, extras, top_k=top_k, top_p=top_p,
                               term=term, teacher_hidden=teacher_hidden)
            picked, more = picked if wants else (picked, {})
    logp = torch.zeros(B, L - 1, dtype=picked.dtype, device=picked.device).index_put(where, picked)
    more = {name: torch.zeros(B, L - 1, dtype=torch.float32, device=picked.device).index_put(where, x)
            for name, x in more.items()}
    if loss is not None:
        return logp.detach(), more, value
    return (logp, more) if wants else logp
