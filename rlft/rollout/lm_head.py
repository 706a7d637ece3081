"""The LM head a chunk of tokens at a time (docs/performance.md, "Logits a chunk at a time").

A causal LM's forward ends in its output embedding, which writes logits [B, T, V] for every position; at a
150k-token vocabulary they are the largest tensors of a training step (64 x 256 x 151,936 in fp32 is 10 GB),
and under autograd their fp32 copies are kept for the backward. rlft's training and scoring forwards stop
at the final hidden states instead: the model's own forward runs with its LM head asked for no positions
(`logits_to_keep` an empty index) while a hook on the decoder (`get_decoder()`) keeps its output, the last
hidden state after the final norm. The head (`get_output_embeddings()`, called as a module, so LoRA and ZeRO-3
see it as they do in the model's forward), the model's final logit processing, the temperature, the
log-softmax, the target gather and the entropy then run over `chunk_tokens` tokens at a time, and only at
the tokens whose log-prob is wanted. A training loss that is a sum of per-token terms (`TokenLoss`: the RL
update's per-token policy losses, SFT's likelihood) is differentiated chunk by chunk in the forward
(`head_loss`): each chunk's gradients reach its hidden states and the head's weights at once and the backward
hands them on, so the head runs once per token, as with the model's own logits. Log-probs alone (DPO, gspo's
sequence ratio) are recomputed a chunk at a time in the backward (torch.utils.checkpoint). Either way at most
one chunk's logits exist at any time, in the forward and the backward.
The checkpoint is the non-reentrant kind: every chunk's backward is part of the one backward pass, so a weight
used by several chunks (and a tied embedding) gets its gradient accumulated once, as DeepSpeed's ZeRO 1-3
reduction expects (the reentrant kind runs a backward per chunk: "gradient computed twice"). Under ZeRO-3 a
frozen head (LoRA) is gathered once into a plain copy (`frozen_zero3_head`): called as a module in the
recompute, ZeRO-3 left it partitioned.

Which final processing a model applies to its logits is read from its config (Gemma's
`final_logit_softcapping`, Cohere's `logit_scale`, Granite's `logits_scaling`); the first forward through a
model checks the chunked head against the model's own logits and stops with a one-line error where they
differ (an architecture that transforms its logits another way: `train.logit_chunk_tokens=0` uses the
model's own logits).
"""
from __future__ import annotations

import contextlib
import inspect
from dataclasses import dataclass
from typing import Callable

import torch
from torch.utils.checkpoint import checkpoint

from rlft.errors import ConfigError

CHUNK_LOGIT_BYTES = 192 * 2**20
"""The default chunk's fp32 logits at most (train.logit_chunk_tokens=null): a chunk's working set in the forward
and the backward's recompute is a few times this (docs/performance.md)."""

DEFAULT_CHUNK_TOKENS: int | None = None
"""Tokens whose logits exist at once where a model has no train.logit_chunk_tokens of its own (None: by
vocabulary, `default_chunk_tokens`)."""


def default_chunk_tokens(vocab: int) -> int:
    """The largest power of two of tokens whose fp32 logits fit CHUNK_LOGIT_BYTES: 1024 at SmolLM2's 49,152-token
    vocabulary, 256 at Qwen2's 151,936. One size for every vocabulary either wastes memory on a large one
    (1024 x 151,936 logits weigh as much as a whole 8 x 384-token micro-batch's) or speed on a small one."""
    tokens = 1
    while 2 * tokens * vocab * 4 <= CHUNK_LOGIT_BYTES:
        tokens *= 2
    return tokens

EXTRAS = ("entropy", "top1")
"""What `head_logp` can return beside the log-probs (no grad): the entropy of each token's distribution and
1 where the target is its argmax."""


def unwrap(model) -> torch.nn.Module:
    """The transformers model under a Trainer, a DeepSpeed engine or a peft wrapper (LoRA layers stay in it)."""
    while isinstance(getattr(model, "module", None), torch.nn.Module):  # rlft's Trainer, a DeepSpeed engine
        model = model.module
    return model.get_base_model() if hasattr(model, "get_base_model") else model


def cache_kwargs(model, cache) -> dict:
    """`cache` under the keyword the model's forward (and `generate`) take a KV cache by: transformers 5.2x
    renamed `past_key_values` to `cache` (the old name deprecated there, and dropped from the forwards in 5.40,
    where it would be ignored without an error); earlier releases and remote-code models keep the old name."""
    forward = inspect.signature(type(unwrap(model)).forward).parameters
    return {"cache" if "cache" in forward else "past_key_values": cache}


def output_cache(out):
    """The KV cache a forward with use_cache=True returned (`cache`, or `past_key_values` before the rename)."""
    cache = getattr(out, "cache", None)
    return cache if cache is not None else out.past_key_values


def logit_processing(config) -> Callable[[torch.Tensor], torch.Tensor]:
    """What the model's forward applies to the LM head's output (identity for most architectures)."""
    cap = getattr(config, "final_logit_softcapping", None)
    scale = getattr(config, "logit_scale", None)
    divide = getattr(config, "logits_scaling", None)

    def process(logits: torch.Tensor) -> torch.Tensor:
        if scale is not None:
            logits = logits * scale
        if divide is not None:
            logits = logits / divide
        if cap is not None:
            logits = torch.tanh(logits / cap) * cap
        return logits
    return process


def chunk_tokens_of(model) -> int:
    """The chunk size a model's forwards use: its Trainer's train.logit_chunk_tokens, else DEFAULT_CHUNK_TOKENS,
    else the size for its vocabulary (0: the model's own logits)."""
    cfg = getattr(model, "cfg", None)
    value = getattr(getattr(cfg, "train", None), "logit_chunk_tokens", None)
    value = DEFAULT_CHUNK_TOKENS if value is None else value
    if value is not None:
        return int(value)
    return default_chunk_tokens(unwrap(model).config.get_text_config().vocab_size)


def hidden_forward(model, **inputs) -> tuple[torch.Tensor, object]:
    """(final hidden states [B, T, H], the model's output) of one forward of `model` with its LM head asked
    for no positions. The first forward through a model also checks the chunked head against its logits."""
    inner = unwrap(model)
    if not getattr(inner, "_rlft_head_checked", False):
        check_head(inner, inputs)
    none = torch.zeros(0, dtype=torch.long, device=inputs["input_ids"].device)
    with decoder_output(inner) as captured:
        out = model(**inputs, logits_to_keep=none)
    return captured[-1], out


@contextlib.contextmanager
def decoder_output(inner: torch.nn.Module):
    """A list that receives the decoder's last hidden state of each forward run inside the block."""
    captured: list[torch.Tensor] = []
    handle = inner.get_decoder().register_forward_hook(lambda _m, _a, out: captured.append(out[0]))
    try:
        yield captured
    finally:
        handle.remove()


@torch.no_grad()
def check_head(inner: torch.nn.Module, inputs: dict) -> None:
    """One forward of the first row's first tokens: the head applied to the decoder's output must give the
    model's own logits (raises where an architecture processes its logits in a way rlft does not read)."""
    ids = inputs["input_ids"][:1, :8]
    with decoder_output(inner) as captured:
        logits = inner(input_ids=ids, attention_mask=torch.ones_like(ids), use_cache=False).logits
    ours = logit_processing(inner.config)(inner.get_output_embeddings()(captured[-1]))
    gap = float((ours.float() - logits.float()).abs().max())
    if gap > 1e-3 * max(1.0, float(logits.float().abs().max())):
        raise ConfigError(f"{type(inner).__name__}: its logits are not its output embedding of its decoder's last "
                         f"hidden state (largest gap {gap:.3g}), so rlft cannot run its LM head a chunk at a time; "
                         "set train.logit_chunk_tokens=0 to use the model's own logits")
    inner._rlft_head_checked = True


@dataclass(frozen=True)
class TeacherTerm:
    """A full-distribution distillation term computed beside the log-probs: the teacher model and the divergence
    of the student's next-token distribution from the teacher's (rlft/algos/divergence.py), both at the
    temperature, untruncated."""
    teacher: object
    kind: str  # forward_kl | reverse_kl | jsd
    beta: float = 0.5
    top_k: int = 0  # over the teacher's top-k and the rest (0: the whole vocabulary)


def head_logp(model, hidden: torch.Tensor, targets: torch.Tensor, temperature: float = 1.0,
              extras: tuple[str, ...] = (), chunk_tokens: int | None = None, top_k: int = 0, top_p: float = 1.0,
              term: TeacherTerm | None = None, teacher_hidden: torch.Tensor | None = None):
    """log softmax(head(hidden) / temperature)[target] per token, [N] fp32, from hidden states [N, H] and
    targets [N], `chunk_tokens` tokens at a time (default: the model's `chunk_tokens_of`); with `top_k` > 0 or
    `top_p` < 1, of the truncated distribution the sampler drew from (`truncate`). `extras` (names in
    EXTRAS) add [N] fp32 tensors without grad; then the result is (log-probs, {name: tensor}). With a teacher
    `term` and the teacher's final hidden states at the same tokens ([N, H_teacher], no grad), the teacher's head
    runs on the same chunks and {"divergence": [N]} (with grad) joins the extras."""
    head, run_head, tail = chunk_function(model, temperature, extras, top_k, top_p, term)

    def piece(h: torch.Tensor, t: torch.Tensor, th: torch.Tensor | None = None):
        return tail(run_head(h), t, th)
    recompute = torch.is_grad_enabled() and (hidden.requires_grad or any(
        p.requires_grad for p in getattr(head, "parameters", tuple)()))
    chunks = chunks_of(hidden, targets, teacher_hidden, max(1, chunk_tokens or chunk_tokens_of(model)))
    parts = [checkpoint(piece, *c, use_reentrant=False, preserve_rng_state=False) if recompute else piece(*c)
             for c in chunks]
    logp = torch.cat([p[0] for p in parts])
    if not extras and term is None:
        return logp
    more = {name: torch.cat([p[1 + i] for p in parts]).detach() for i, name in enumerate(extras)}
    if term is not None:
        more["divergence"] = torch.cat([p[-1] for p in parts])
    return logp, more


def chunk_function(model, temperature: float, extras: tuple[str, ...], top_k: int, top_p: float,
                   term: TeacherTerm | None) -> tuple[object, Callable, Callable]:
    """(the model's head, run_head, tail) of one chunk of tokens: run_head(hidden [n, H]) is the head's output
    [n, V] in the model's head context (a LoRA reference's: the adapter off), and tail(that output, targets [n]
    [, teacher hidden [n, H_t]]) -> (log-probs [n], *extras [n] without grad[, divergence [n]]). A chunk's
    logits exist only inside the two."""
    head, process, context = head_parts(model)
    divergence = teacher_divergence(term, temperature) if term is not None else None

    def tail(raw: torch.Tensor, t: torch.Tensor, th: torch.Tensor | None = None):
        logits = process(raw).float()
        if temperature != 1.0:
            logits = logits / temperature
        full = logits
        logits = truncate(logits, t, top_k, top_p)
        lse = torch.logsumexp(logits, -1)
        logp = logits.gather(-1, t[:, None])[:, 0] - lse
        with torch.no_grad():
            more = [entropy_of(logits, lse) if name == "entropy" else (logits.argmax(-1) == t).float()
                    for name in extras]
        return (logp, *more) if th is None else (logp, *more, divergence(full, th))

    def run_head(h: torch.Tensor) -> torch.Tensor:
        with context():
            return head(h)
    return head, run_head, tail


def chunks_of(hidden: torch.Tensor, targets: torch.Tensor, teacher_hidden: torch.Tensor | None, step: int) -> list:
    """(hidden, targets[, teacher hidden]) of each chunk of `step` tokens."""
    parts = [hidden.split(step), targets.split(step)] + ([teacher_hidden.split(step)] if teacher_hidden is not None
                                                          else [])
    return list(zip(*parts))


@dataclass(frozen=True)
class TokenLoss:
    """A training loss that is a sum over tokens of terms each computed from that token's own log-prob:
    fn(log-probs [n], {name: [n]} this chunk's `inputs`, the teacher divergence [n] or None) -> each token's term
    [n], its weight in the loss included. `inputs` are [B, L-1] target-aligned tensors (a token_logp or
    packed_logp caller's), taken at the same tokens as the log-probs. Such a loss's gradient is known chunk by
    chunk in the forward (`head_loss`)."""
    fn: Callable
    inputs: dict
    kernel: Callable | None = None
    """liger-kernel's fused linear loss of the same sum (rlft/rollout/liger.py; train.fused_loss=liger):
    kernel(the linear head, hidden [n, H], targets [n], inputs) -> the loss with grad; None: rlft's own."""


FUSED = True
"""A `TokenLoss` through the chunked head computes the head's gradients in the forward (`head_loss`); False:
the chunks are recomputed in the backward as for log-probs alone (what the benchmark compares)."""


def head_loss(model, hidden: torch.Tensor, targets: torch.Tensor, fn: Callable, inputs: dict,
              temperature: float = 1.0, extras: tuple[str, ...] = (), chunk_tokens: int | None = None,
              top_k: int = 0, top_p: float = 1.0, term: TeacherTerm | None = None,
              teacher_hidden: torch.Tensor | None = None, kernel: Callable | None = None):
    """(the loss sum over tokens of fn (TokenLoss.fn) with grad, log-probs [N] and {extra: [N]} without grad) of
    hidden states [N, H], targets [N] and the loss's per-token `inputs` {name: [N]}, as `head_logp`.

    Each chunk's logits, log-probs and loss terms are differentiated at once, in the forward: the gradient of
    the chunk's terms reaches its hidden states and the head's weights there (the head run once, its weights'
    and inputs' gradients two products of the chunk's logit gradient, the same arithmetic as the model's own
    logits), and the backward only hands these on. The checkpointed path instead runs the head twice, once
    more in the backward: on a 150k-token vocabulary the head is a quarter of a 0.5B model's weights. Not
    under ZeRO-3 with a trainable head (its weights are partitioned outside their module's forward and
    backward) and not with FUSED off: there the log-probs take `head_logp`'s path and fn follows them. With a
    `kernel` (TokenLoss.kernel) liger's fused loss gives the loss and the log-probs and extras are computed
    without grad."""
    if kernel is not None and torch.is_grad_enabled():
        from rlft.rollout.liger import linear_head

        value = kernel(linear_head(unwrap(model)), hidden, targets, inputs) if len(targets) else hidden.sum() * 0.0
        with torch.no_grad():
            out = head_logp(model, hidden, targets, temperature, extras, chunk_tokens, top_k, top_p, term,
                            teacher_hidden)
        logp, more = out if (extras or term is not None) else (out, {})
        return value, logp, more
    head, run_head, tail = chunk_function(model, temperature, extras, top_k, top_p, term)
    params = [p for p in getattr(head, "parameters", tuple)() if p.requires_grad]
    if not (FUSED and torch.is_grad_enabled() and (hidden.requires_grad or params)) or \
            any(hasattr(p, "ds_id") for p in params):
        out = head_logp(model, hidden, targets, temperature, extras, chunk_tokens, top_k, top_p, term, teacher_hidden)
        logp, more = out if (extras or term is not None) else (out, {})
        loss = fn(logp, inputs, more.get("divergence")).sum()
        return loss, logp.detach(), {name: tensor.detach() for name, tensor in more.items()}
    step = max(1, chunk_tokens or chunk_tokens_of(model))
    total = torch.zeros((), dtype=torch.float32, device=hidden.device)
    grad_hidden, grad_params, logps, mores = [], [None] * len(params), [], []
    begin = 0
    for chunk in chunks_of(hidden.detach(), targets, teacher_hidden, step):
        n = len(chunk[1])
        here = {name: value[begin:begin + n] for name, value in inputs.items()}
        terms, out = differentiate_chunk(head, run_head, tail, chunk, fn, here, term is not None,
                                         hidden.requires_grad, params, grad_hidden, grad_params)
        total = total + terms
        logps.append(out[0])
        mores.append(out[1:])
        begin += n
    gradients = [torch.cat(grad_hidden) if grad_hidden else None] + grad_params
    value = HandOn.apply(total, gradients, hidden, *params)
    names = list(extras) + (["divergence"] if term is not None else [])
    return value, torch.cat(logps), {name: torch.cat([m[i] for m in mores]) for i, name in enumerate(names)}


def differentiate_chunk(head, run_head, tail, chunk: tuple, fn: Callable, here: dict, with_term: bool,
                        wants_hidden: bool, params: list, grad_hidden: list, grad_params: list) -> tuple:
    """One chunk of `head_loss`: (the sum of its loss terms, (log-probs, *extras[, divergence])), all without
    grad; its hidden states' gradient appended to `grad_hidden`, its head parameters' added to `grad_params`.
    Its logits and their gradient are freed on return, before the next chunk makes its own."""
    h, linear = chunk[0], type(head) is torch.nn.Linear  # a linear head: its two gradient products by hand
    with torch.enable_grad():
        if linear:  # differentiate from the head's output on
            with torch.no_grad():
                leaf = run_head(h)
            out = tail(leaf.requires_grad_(), *chunk[1:])
        else:  # any other head (a LoRA layer, a frozen ZeRO-3 copy): through its module
            leaf = h.detach().requires_grad_(wants_hidden)
            out = tail(run_head(leaf), *chunk[1:])
        terms = fn(out[0], here, out[-1] if with_term else None).sum()
        wrt = [leaf] if leaf.requires_grad else []
        grads = torch.autograd.grad(terms, wrt + ([] if linear else params)) if wrt or params else ()
    if linear:
        with torch.no_grad():  # the products must not join the caller's graph (head.weight requires grad)
            linear_grads(head, h, grads[0], wants_hidden, grad_hidden, params, grad_params)
    else:
        if leaf.requires_grad:
            grad_hidden.append(grads[0])
        for k, g in enumerate(grads[len(grads) - len(params):]):
            grad_params[k] = g if grad_params[k] is None else grad_params[k].add_(g)
    return terms.detach(), tuple(value.detach() for value in out)


def linear_grads(head: torch.nn.Linear, h: torch.Tensor, grad_out: torch.Tensor, wants_hidden: bool,
                 grad_hidden: list, params: list, grad_params: list) -> None:
    """A linear head's gradients from its output's gradient [n, V] for a chunk of hidden states h [n, H]: the
    hidden states' appended to `grad_hidden`, the weight's and the bias's added in place to `grad_params` (in
    the order of `params`, the head's trainable ones)."""
    if wants_hidden:
        grad_hidden.append(grad_out @ head.weight)
    for k, p in enumerate(params):
        if p is head.weight:
            grad_params[k] = grad_out.T @ h if grad_params[k] is None else grad_params[k].addmm_(grad_out.T, h)
        else:  # the bias
            grad_params[k] = grad_out.sum(0) if grad_params[k] is None else grad_params[k].add_(grad_out.sum(0))


class HandOn(torch.autograd.Function):
    """A scalar whose backward hands its inputs the gradients computed in the forward (`head_loss`), scaled by
    the scalar's own gradient."""

    @staticmethod
    def forward(ctx, value, gradients, *inputs):
        ctx.gradients = gradients
        return value.clone()

    @staticmethod
    def backward(ctx, upstream):
        gradients, ctx.gradients = ctx.gradients, None  # its own: scaled in place, no second copy of a weight's
        return (None, None, *(None if g is None else g.mul_(upstream.to(g.dtype)) for g in gradients))


def head_parts(model) -> tuple[Callable, Callable, Callable]:
    """A model's LM head (a plain copy where ZeRO-3 partitions a frozen one), its final logit processing, and the
    context its head runs in (a LoRA reference's: the adapter off)."""
    inner = unwrap(model)
    return (frozen_zero3_head(inner.get_output_embeddings()), logit_processing(inner.config),
            getattr(model, "head_context", contextlib.nullcontext))


def teacher_divergence(term: TeacherTerm, temperature: float) -> Callable[[torch.Tensor, torch.Tensor], torch.Tensor]:
    """(the student's fp32 logits / temperature of a chunk [N, V], the teacher's hidden states there) -> the
    term's divergence per token [N], with grad to the student's logits: the teacher's head runs without grad; a
    vocabulary of another size than the student's is one line (distillation needs the same tokenizer)."""
    from rlft.algos.divergence import token_divergence

    head, process, context = head_parts(term.teacher)

    def divergence(student: torch.Tensor, th: torch.Tensor) -> torch.Tensor:
        with torch.no_grad(), context():
            teacher = process(head(th)).float()
        if teacher.shape[-1] != student.shape[-1]:
            raise ConfigError(f"the teacher's LM head has {teacher.shape[-1]} rows and the student's "
                              f"{student.shape[-1]}: a full-distribution divergence needs the same vocabulary "
                              "(algo.distill_divergence=sampled compares the sampled tokens only)")
        if temperature != 1.0:
            teacher = teacher / temperature
        return token_divergence(student, teacher, term.kind, term.beta, term.top_k)
    return divergence


def frozen_zero3_head(head: torch.nn.Module):
    """The head as a function of the hidden states. Under DeepSpeed ZeRO-3 a head without trainable weights (a
    LoRA model's) is gathered once into a plain copy: called as a module in the backward's recompute, ZeRO-3
    left it partitioned. A trainable head runs as its module, gathered by ZeRO-3's own hooks."""
    params = [p for p in head.parameters() if hasattr(p, "ds_id")]
    if not params or any(p.requires_grad for p in head.parameters()):
        return head
    import deepspeed

    with deepspeed.zero.GatheredParameters(params):
        weight = head.weight.detach().clone()
        bias = head.bias.detach().clone() if getattr(head, "bias", None) is not None else None
    return lambda h: torch.nn.functional.linear(h, weight, bias)


def entropy_of(logits: torch.Tensor, lse: torch.Tensor) -> torch.Tensor:
    """Entropy of softmax(logits) per row, from the rows' logsumexp: lse - sum(p * logits) (tokens truncated
    to -inf contribute 0)."""
    p = torch.softmax(logits, -1)
    return lse - torch.where(p > 0, p * logits, torch.zeros_like(logits)).sum(-1)


def truncate(logits: torch.Tensor, targets: torch.Tensor, top_k: int = 0, top_p: float = 1.0) -> torch.Tensor:
    """fp32 logits [N, V] (after the temperature) with the tokens top-k and top-p sampling would not draw set to
    -inf: transformers' own warpers, in the sampler's order (rlft/rollout/generate.py, hf_processors; vLLM
    applies the same two), so the log-softmax is the truncated, renormalised distribution each token was
    drawn from. Each row's target keeps its logit even where this model's kept set leaves it out (a token the
    sampler drew, at the edge of the set, from slightly different weights or arithmetic), so its log-prob
    stays finite. top_k = 0 and top_p = 1: the logits unchanged."""
    if top_k <= 0 and top_p >= 1.0:
        return logits
    from transformers import TopKLogitsWarper, TopPLogitsWarper

    kept = logits
    if top_k > 0:
        kept = TopKLogitsWarper(top_k)(None, kept)
    if top_p < 1.0:
        kept = TopPLogitsWarper(top_p)(None, kept)
    return kept.scatter(-1, targets[:, None], logits.gather(-1, targets[:, None]))
