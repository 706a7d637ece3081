"""A lean sampler for Llama-family decoders (llama, mistral, qwen2, qwen3): the model's own weights,
a preallocated KV cache, and nothing else in the decoding loop.

Hugging Face's `generate` is general (any architecture, any cache, any logits processor) and pays
for it on every decoding step; a decoding step of a small model is almost all such overhead. This
sampler runs the same computation as the Hugging Face modules (RMSNorm in fp32, rotary embeddings
from the model's own `rotary_emb`, grouped-query SDPA attention, SwiGLU), with:

- the prompt prefilled once per *distinct* prompt (GRPO's G samples of a prompt share it) and its
  keys and values copied to the G rows;
- a KV cache allocated once per batch, attended up to the current length only;
- sampling by the Gumbel-max trick on the processed logits (exactly a draw from softmax(logits),
  without torch.multinomial's slow exponential draws); temperature, top-k and top-p by Hugging
  Face's own logits warpers, the model's `generation_config.suppress_tokens` honoured;
- on a GPU (cuda_graph=True), a fixed-shape decoding step captured once per batch as a CUDA graph
  and replayed for every token.

It reads parameters directly, so it must run where they are whole (under ZeRO-3, inside the
engine's gathered context, as all generation does). `unsupported(model)` says why a model cannot
take this path (other architectures, adapters, sliding windows, dynamic rotary scaling); the
caller then falls back to `generate`. Correctness is tested against Hugging Face: identical
greedy completions and next-token log-probs equal to 1e-5 in fp32 (tests/unit/test_lean.py).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from transformers.generation.logits_process import TemperatureLogitsWarper, TopKLogitsWarper, TopPLogitsWarper

ARCHITECTURES = ("llama", "mistral", "qwen2", "qwen3")
STATIC_ROPE = ("default", "linear", "llama3", "yarn")  # rotary frequencies that do not depend on length


def unsupported(model, total_len: int | None = None) -> str | None:
    """Why `model` cannot use the lean sampler (None when it can)."""
    c = model.config
    if c.model_type not in ARCHITECTURES:
        return f"architecture {c.model_type!r} (lean sampling supports {', '.join(ARCHITECTURES)})"
    if getattr(c, "hidden_act", "silu") != "silu":
        return f"activation {c.hidden_act!r}"
    body = getattr(model, "model", None)
    if body is None or not hasattr(body, "layers") or not isinstance(getattr(model, "lm_head", None), torch.nn.Linear):
        return "not a plain *ForCausalLM module (wrapped or adapted)"
    for layer in body.layers:
        attn, mlp = layer.self_attn, layer.mlp
        for proj in (attn.q_proj, attn.k_proj, attn.v_proj, attn.o_proj, mlp.gate_proj, mlp.up_proj, mlp.down_proj):
            if type(proj) is not torch.nn.Linear:
                return f"projection of type {type(proj).__name__} (adapter or quantised layer)"
    rope = getattr(body.rotary_emb, "rope_type", "default")
    if rope not in STATIC_ROPE:
        return f"rotary scaling {rope!r}"
    window = getattr(c, "sliding_window", None)
    uses_window = getattr(c, "use_sliding_window", c.model_type == "mistral")
    if window and uses_window and (total_len is None or total_len > window):
        return f"sliding-window attention (window {window})"
    return None


def rms_norm(x: torch.Tensor, norm) -> torch.Tensor:
    """Hugging Face's Llama RMSNorm: normalise in fp32, scale in the input dtype (one fused op in fp32,
    where the two are the same computation)."""
    dtype = x.dtype
    if dtype == torch.float32 and norm.weight.dtype == torch.float32:
        return F.rms_norm(x, x.shape[-1:], norm.weight, norm.variance_epsilon)
    h = x.float()
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + norm.variance_epsilon)
    return norm.weight * h.to(dtype)


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), -1)


class Arch:
    """The attention shape of a supported model."""

    def __init__(self, model):
        c = model.config
        self.heads, self.kv_heads = c.num_attention_heads, c.num_key_value_heads
        self.head_dim = getattr(c, "head_dim", None) or c.hidden_size // c.num_attention_heads
        self.qk_norm = c.model_type == "qwen3"


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


class LeanDecoder:
    """One batch of sampling: prefill, then one token per step into a preallocated cache.

    `step` attends to the filled columns only (shapes change every step: the fast eager path).
    `fixed_step` is the same computation with fixed shapes (every column, masked; the new column
    chosen by a device tensor), which a CUDA graph can capture and replay; `FixedStepGraph` does
    that on a GPU."""

    def __init__(self, model, batch: int, max_len: int, device: torch.device):
        self.model, self.body, self.arch = model, model.model, Arch(model)
        dtype = self.body.embed_tokens.weight.dtype
        shape = (batch, self.arch.kv_heads, max_len, self.arch.head_dim)
        # zeros, not empty: the fixed-shape step reads unfilled columns (masked, weight 0, but
        # garbage such as NaN would survive 0 * NaN)
        self.keys = [torch.zeros(shape, dtype=dtype, device=device) for _ in self.body.layers]
        self.values = [torch.zeros(shape, dtype=dtype, device=device) for _ in self.body.layers]
        self.length = 0  # cache columns filled
        # rotary cos/sin of every position this batch can reach, looked up per decoding step
        self.cos, self.sin = rotary_table(model, max_len, dtype, device)

    def _rope(self, x: torch.Tensor, positions: torch.Tensor):
        """cos, sin [b, 1, T, D] for positions [b, T]."""
        return self.cos[positions].unsqueeze(1), self.sin[positions].unsqueeze(1)

    def _logits(self, x_last: torch.Tensor) -> torch.Tensor:
        return head_logits(self.model, x_last).float()

    def prefill(self, ids: torch.Tensor, attn: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
        """Run the distinct prompts `ids` [u, P] (left-padded, mask `attn`), where batch row r
        samples prompt rows[r]: fills the first P cache columns of every row and returns the
        next-token logits [batch, V] (fp32)."""
        P = ids.shape[1]
        positions = (attn.long().cumsum(-1) - 1).masked_fill(attn == 0, 1)
        causal = torch.ones(P, P, dtype=torch.bool, device=ids.device).tril()
        # a query sees earlier real tokens; a padding query sees itself, which keeps its output finite
        mask = ((causal & attn.bool()[:, None, :]) | torch.eye(P, dtype=torch.bool, device=ids.device))[:, None]
        x = self.body.embed_tokens(ids)
        cos, sin = self._rope(x, positions)
        for i, layer in enumerate(self.body.layers):
            q, k, v = project_qkv(self.arch, layer, x, cos, sin)
            self.keys[i][:, :, :P] = k.index_select(0, rows)
            self.values[i][:, :, :P] = v.index_select(0, rows)
            x = attend_and_mlp(self.arch, layer, x, q, k, v, mask)
        self.length = P
        return self._logits(x[:, -1]).index_select(0, rows)

    def step(self, tokens: torch.Tensor, positions: torch.Tensor, key_mask: torch.Tensor | None) -> torch.Tensor:
        """Append one token per row (tokens [batch], their positions [batch]); `key_mask` [batch, L]
        marks the cache columns a row may attend to (None: all). Returns next-token logits."""
        t = self.length
        x = self.body.embed_tokens(tokens[:, None])
        cos, sin = self._rope(x, positions[:, None])
        mask = None if key_mask is None else key_mask[:, None, None, :t + 1]
        for i, layer in enumerate(self.body.layers):
            q, k, v = project_qkv(self.arch, layer, x, cos, sin)
            self.keys[i][:, :, t:t + 1], self.values[i][:, :, t:t + 1] = k, v
            x = attend_and_mlp(self.arch, layer, x, q, self.keys[i][:, :, :t + 1], self.values[i][:, :, :t + 1], mask)
        self.length = t + 1
        return self._logits(x[:, -1])


    def fixed_step(self, tokens: torch.Tensor, positions: torch.Tensor, column: torch.Tensor,
                   visible: torch.Tensor) -> torch.Tensor:
        """`step` with fixed shapes: tokens, positions [B]; column [1] (long, on the device) is the
        cache column to fill; visible [B, L] (bool) is updated in place to include it. Attends over
        every column, masked. No host synchronisation and no shape that changes between steps."""
        x = self.body.embed_tokens(tokens[:, None])
        cos = self.cos.index_select(0, positions)[:, None, None]
        sin = self.sin.index_select(0, positions)[:, None, None]
        visible.index_fill_(1, column, True)
        mask = visible[:, None, None, :]
        for i, layer in enumerate(self.body.layers):
            q, k, v = project_qkv(self.arch, layer, x, cos, sin)
            self.keys[i].index_copy_(2, column, k)
            self.values[i].index_copy_(2, column, v)
            x = attend_and_mlp(self.arch, layer, x, q, self.keys[i], self.values[i], mask)
        return self._logits(x[:, -1])


class FixedStepGraph:
    """LeanDecoder.fixed_step captured once in a CUDA graph and replayed for every token (one
    launch per step instead of one per operation). Inputs are copied into static buffers."""

    def __init__(self, decoder: LeanDecoder, visible: torch.Tensor, first_column: int):
        B, device = visible.shape[0], visible.device
        self.decoder, self.visible = decoder, visible
        self.tokens = torch.zeros(B, dtype=torch.long, device=device)
        self.positions = torch.zeros(B, dtype=torch.long, device=device)
        self.column = torch.full((1,), first_column, dtype=torch.long, device=device)
        saved = visible.clone()
        side = torch.cuda.Stream(device)
        side.wait_stream(torch.cuda.current_stream(device))
        with torch.cuda.stream(side):  # warm-up outside the graph (allocator, kernels' lazy set-up)
            decoder.fixed_step(self.tokens, self.positions, self.column, visible)
        torch.cuda.current_stream(device).wait_stream(side)
        self.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.graph):
            self.logits = decoder.fixed_step(self.tokens, self.positions, self.column, visible)
        visible.copy_(saved)  # the warm-up and capture wrote column `first_column`; its real step rewrites it

    def step(self, tokens: torch.Tensor, positions: torch.Tensor, column: int) -> torch.Tensor:
        self.tokens.copy_(tokens)
        self.positions.copy_(positions)
        self.column.fill_(column)
        self.graph.replay()
        return self.logits


def rotary_table(model, length: int, dtype, device) -> tuple[torch.Tensor, torch.Tensor]:
    """cos, sin [length, D] of positions 0..length-1, from the model's own rotary embedding."""
    cos, sin = model.model.rotary_emb(torch.empty(0, dtype=dtype, device=device),
                                      torch.arange(length, device=device)[None])
    return cos[0], sin[0]


def logits_warpers(temperature: float, top_k: int, top_p: float) -> list:
    """Hugging Face's own warpers, in generate's order (temperature, top-k, top-p)."""
    warpers = []
    if temperature != 1.0:
        warpers.append(TemperatureLogitsWarper(temperature))
    if top_k:
        warpers.append(TopKLogitsWarper(top_k))
    if top_p < 1.0:
        warpers.append(TopPLogitsWarper(top_p))
    return warpers


def gumbel_sample(logits: torch.Tensor, noise: torch.Tensor | None = None) -> torch.Tensor:
    """One draw per row from softmax(logits): argmax of logits + Gumbel noise (-inf never wins)."""
    return (logits + (gumbel_noise(logits.shape, logits.device) if noise is None else noise)).argmax(-1)


def gumbel_noise(shape, device: torch.device) -> torch.Tensor:
    """Standard Gumbel noise, -log(-log(U)) for U uniform on [0, 1)."""
    return torch.rand(shape, device=device).log_().neg_().log_().neg_()


def distinct_rows(ids: torch.Tensor, attn: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(distinct prompt rows, their masks, row -> distinct index) for a left-padded batch."""
    distinct, rows = torch.unique(torch.cat([ids, attn.to(ids.dtype)], 1), dim=0, return_inverse=True)
    width = ids.shape[1]
    return distinct[:, :width], distinct[:, width:], rows


@torch.no_grad()
def lean_generate(model, ids: torch.Tensor, attn: torch.Tensor, max_new_tokens: int, do_sample: bool,
                  temperature: float, top_k: int, top_p: float, eos_id: int, pad_id: int,
                  cuda_graph: bool = False) -> torch.Tensor:
    """New tokens [B, <= max_new_tokens] for the left-padded prompts `ids`/`attn`, PAD after a row's
    EOS (Hugging Face generate's output past the prompt). Stops when every row has ended.
    `cuda_graph` (CUDA devices only): decode with the fixed-shape step replayed from a CUDA graph."""
    B, P = ids.shape
    device = ids.device
    decoder = LeanDecoder(model, B, P + max_new_tokens, device)
    unique_ids, unique_attn, rows = distinct_rows(ids, attn)
    logits = decoder.prefill(unique_ids, unique_attn, rows)
    padded = bool((attn == 0).any())
    key_mask = None
    if padded:
        key_mask = torch.ones(B, P + max_new_tokens, dtype=torch.bool, device=device)
        key_mask[:, :P] = attn.bool()
    positions = attn.long().sum(-1)  # the next token's position: real tokens so far
    step = lambda tok, s: decoder.step(tok, positions + s, key_mask)  # noqa: E731
    if cuda_graph and device.type == "cuda" and max_new_tokens > 1:
        visible = torch.zeros(B, P + max_new_tokens, dtype=torch.bool, device=device)
        visible[:, :P] = attn.bool()
        graph = FixedStepGraph(decoder, visible, P)
        step = lambda tok, s: graph.step(tok, positions + s, P + s)  # noqa: E731
    suppress = list(getattr(model.generation_config, "suppress_tokens", None) or [])
    warpers = logits_warpers(temperature, top_k, top_p) if do_sample else []
    out = torch.full((B, max_new_tokens), pad_id, dtype=torch.long, device=device)
    done = torch.zeros(B, dtype=torch.bool, device=device)
    for s in range(max_new_tokens):
        if suppress:
            logits[:, suppress] = -float("inf")
        for warp in warpers:
            logits = warp(None, logits)
        token = gumbel_sample(logits) if do_sample else logits.argmax(-1)
        token = token.masked_fill(done, pad_id)
        out[:, s] = token
        done |= token == eos_id
        if bool(done.all()) or s == max_new_tokens - 1:
            return out[:, :s + 1]
        logits = step(token, s)
    return out
