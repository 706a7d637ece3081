"""The update's forward with each distinct prompt computed once (shared-prefix forward).

A GRPO micro-batch holds G completions of each prompt; the plain forward runs the prompt G times.
Here the distinct prompts run once (causal attention among their own tokens) and every completion
attends to its prompt's keys and values (copied per row inside the autograd graph, so gradients
from all G completions reach the one prompt computation) and causally to its own tokens. Token-wise
work (projections, MLP, norms) falls by (G-1)/G of the prompt's share of the tokens: at 64 prompt
+ 128 completion tokens and G = 8, 29% of the tokens.

Same model, same positions, same masks as the plain forward: the completion log-probs agree to
1e-5 in fp32 and so do the gradients (tests/unit/test_prefix.py). Llama-family models whose
parameters are whole on every rank (ZeRO 0-2; see lean.unsupported), `engine.shared_prefix`.
The engine's setting alone picks this path (also for a micro-batch without a repeated prompt), so
all ranks build the same graph and ZeRO's gradient buckets fill in the same order.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

from rlft.rollout.lean import Arch, rms_norm, rotary_table


@dataclass
class PrefixLayout:
    """Where each row's completion sits: row r samples distinct prompt group[r] (of length
    prompt_lens[r]) and has completion_lens[r] completion tokens."""
    group: list[int]
    distinct: list[tuple[int, ...]]
    prompt_lens: list[int]
    completion_lens: list[int]

    @property
    def group_size(self) -> int | None:
        """G when row r samples distinct prompt r // G for every row (GRPO's layout: consecutive
        groups of equal size), else None."""
        G, rest = divmod(len(self.group), max(1, len(self.distinct)))
        if G == 0 or rest:
            return None
        return G if self.group == [r // G for r in range(len(self.group))] else None


def prefix_layout(ids: torch.Tensor, attn: torch.Tensor, prompt_lens: list[int]) -> PrefixLayout:
    """Group the rows of a right-padded prompt+completion batch by identical prompt."""
    rows = ids.tolist()
    index: dict[tuple[int, ...], int] = {}
    group = [index.setdefault(tuple(row[:p]), len(index)) for row, p in zip(rows, prompt_lens)]
    lengths = attn.sum(-1).tolist()
    return PrefixLayout(group, list(index), list(prompt_lens), [n - p for n, p in zip(lengths, prompt_lens)])


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), -1)


def project_qkv(arch: Arch, layer, x: torch.Tensor, cos, sin):
    """Queries [b, H, T, D] and keys, values [b, KV, T, D] of one decoder layer for hidden states
    x [b, T, hidden], rotary embedding applied (cos, sin broadcastable to [b, 1, T, D])."""
    b, T, _ = x.shape
    attn = layer.self_attn
    h = rms_norm(x, layer.input_layernorm)
    q = F.linear(h, attn.q_proj.weight, attn.q_proj.bias).view(b, T, arch.heads, arch.head_dim)
    k = F.linear(h, attn.k_proj.weight, attn.k_proj.bias).view(b, T, arch.kv_heads, arch.head_dim)
    v = F.linear(h, attn.v_proj.weight, attn.v_proj.bias).view(b, T, arch.kv_heads, arch.head_dim)
    if arch.qk_norm:
        q, k = rms_norm(q, attn.q_norm), rms_norm(k, attn.k_norm)
    q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
    return q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin, v


def attend_and_mlp(arch: Arch, layer, x: torch.Tensor, q, keys, values, mask) -> torch.Tensor:
    """The rest of the layer: attention of q over keys/values (boolean `mask`, True = attend),
    output projection, residual, MLP, residual."""
    b, T, _ = x.shape
    attn, mlp = layer.self_attn, layer.mlp
    out = F.scaled_dot_product_attention(q, keys, values, attn_mask=mask, scale=attn.scaling,
                                         enable_gqa=arch.kv_heads != arch.heads)
    x = x + F.linear(out.transpose(1, 2).reshape(b, T, -1), attn.o_proj.weight, attn.o_proj.bias)
    h = rms_norm(x, layer.post_attention_layernorm)
    gate = F.linear(h, mlp.gate_proj.weight, mlp.gate_proj.bias)
    up = F.linear(h, mlp.up_proj.weight, mlp.up_proj.bias)
    return x + F.linear(F.silu(gate) * up, mlp.down_proj.weight, mlp.down_proj.bias)


def head_logits(model, h: torch.Tensor) -> torch.Tensor:
    """Final norm and LM head (in the model's dtype)."""
    return F.linear(rms_norm(h, model.model.norm), model.lm_head.weight, model.lm_head.bias)


def shared_prefix_logits(model, ids: torch.Tensor, layout: PrefixLayout, pad_id: int = 0,
                         activation_checkpointing: bool = False):
    """(logits [b, C, V], targets [b, C], valid [b, C]) where row r's column j is completion
    token j predicted from everything before it (its prompt and completion tokens 0..j-1)."""
    dev = ids.device
    arch, body = Arch(model), model.model
    b = len(layout.group)
    P = max(len(p) for p in layout.distinct)
    C = max(max(layout.completion_lens), 1)
    prompt_ids = torch.tensor([[pad_id] * (P - len(p)) + list(p) for p in layout.distinct], device=dev)
    prompt_attn = torch.tensor([[0] * (P - len(p)) + [1] * len(p) for p in layout.distinct], device=dev).bool()
    plens = torch.tensor(layout.prompt_lens, device=dev)
    cols = plens[:, None] + torch.arange(C, device=dev)
    targets = torch.nn.functional.pad(ids, (0, C), value=pad_id).gather(1, cols)
    valid = torch.arange(C, device=dev)[None] < torch.tensor(layout.completion_lens, device=dev)[:, None]
    group = torch.tensor(layout.group, device=dev)
    G = layout.group_size

    def spread(x: torch.Tensor) -> torch.Tensor:
        """Distinct-prompt rows of x to the batch's rows; in consecutive groups by repetition, whose
        backward is a sum over each group (index_select's is a much slower scatter on CPU)."""
        return x.repeat_interleave(G, 0) if G else x.index_select(0, group)

    dtype = body.embed_tokens.weight.dtype
    cos, sin = rotary_table(model, int(cols.max()) + 1, dtype, dev)
    prompt_pos = (prompt_attn.long().cumsum(-1) - 1).clamp(min=0)
    rope_p = (cos[prompt_pos].unsqueeze(1), sin[prompt_pos].unsqueeze(1))
    rope_c = (cos[cols].unsqueeze(1), sin[cols].unsqueeze(1))
    causal_p = torch.ones(P, P, dtype=torch.bool, device=dev).tril()
    # a prompt query sees earlier real prompt tokens (a padding query itself, which keeps it finite);
    # a completion query sees its prompt's real tokens and its own earlier completion tokens
    mask_p = ((causal_p & prompt_attn[:, None, :]) | torch.eye(P, dtype=torch.bool, device=dev))[:, None]
    causal_c = torch.ones(C, C, dtype=torch.bool, device=dev).tril()
    mask_c = torch.cat([prompt_attn[group][:, None, :].expand(b, C, P), causal_c.expand(b, C, C)], -1)[:, None]

    def layer_forward(layer, xp, xc):
        qp, kp, vp = project_qkv(arch, layer, xp, *rope_p)
        qc, kc, vc = project_qkv(arch, layer, xc, *rope_c)
        keys = torch.cat([spread(kp), kc], 2)
        values = torch.cat([spread(vp), vc], 2)
        return (attend_and_mlp(arch, layer, xp, qp, kp, vp, mask_p),
                attend_and_mlp(arch, layer, xc, qc, keys, values, mask_c))

    xp, xc = body.embed_tokens(prompt_ids), body.embed_tokens(targets)
    for layer in body.layers:
        if activation_checkpointing and torch.is_grad_enabled():
            xp, xc = checkpoint(layer_forward, layer, xp, xc, use_reentrant=False)
        else:
            xp, xc = layer_forward(layer, xp, xc)
    # completion token 0 is predicted from the prompt's last position, token j from completion token j-1
    hidden = torch.cat([spread(xp[:, -1:]), xc[:, :-1]], 1)
    return head_logits(model, hidden), targets, valid


def to_target_columns(values: torch.Tensor, valid: torch.Tensor, layout: PrefixLayout, start: int,
                      width: int) -> torch.Tensor:
    """Place per-completion-token values [b, C] at their target columns start..start+width-1 of the
    plain layout (row r's token j at column prompt_lens[r] - 1 + j); zeros elsewhere. Differentiable."""
    offsets = torch.tensor(layout.prompt_lens, device=values.device) - 1 - start
    rows, j = valid.nonzero(as_tuple=True)
    cols = offsets[rows] + j
    inside = (cols >= 0) & (cols < width)
    rows, j, cols = rows[inside], j[inside], cols[inside]
    return values.new_zeros(values.shape[0], width).index_put((rows, cols), values[rows, j])
