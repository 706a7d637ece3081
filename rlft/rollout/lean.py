"""A lean sampler for Llama-family decoders (llama, mistral, qwen2, qwen3): the model's own weights,
a preallocated KV cache, and nothing else in the decoding loop.

Hugging Face's `generate` is general (any architecture, any cache, any logits processor) and pays
for it on every decoding step; a decoding step of a small model is almost all such overhead. This
sampler runs the same computation as the Hugging Face modules (RMSNorm in fp32, rotary embeddings
from the model's own `rotary_emb`, grouped-query SDPA attention, SwiGLU) in as few operations per
step as it can, with:

- the prompt prefilled once per *distinct* prompt (GRPO's G samples of a prompt share it) and its
  keys and values copied to the G rows;
- a KV cache allocated once per batch, attended up to the current length only;
- queries, keys and values from one product and gate and up from another (packed copies of the
  weights for the call), query/key rows in pair order so that the rotary embedding is one complex
  multiplication (`pair_order`, `rotate_pairs`), residual additions inside the output products;
- sampling by the Gumbel-max trick on the processed logits (exactly a draw from softmax(logits),
  without torch.multinomial's slow exponential draws), the noise drawn for many steps at once;
  temperature, top-k and top-p by Hugging Face's own logits warpers; the model's
  `generation_config.suppress_tokens` as -inf in the LM head's bias;
- on a GPU (cuda_graph=True), a fixed-shape decoding step captured once per batch as a CUDA graph
  and replayed for every token;
- on the CPU in fp32 (native=the kernel module), the decoding step compiled from C++
  (rlft/rollout/native.py, csrc/decode_cpu.cpp): the same computation with its element-wise work
  and attention fused into a few loops; keys are then cached transposed, each distinct prompt's
  once for all its rows ([U, KV, D, P]) and the rows' own apart ([B, KV, D, N]) (columns rounded
  up to a multiple of 16).

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
    """Hugging Face's Llama RMSNorm (module `norm`) applied to x."""
    return rms_norm_weight(x, norm.weight, norm.variance_epsilon)


def rms_norm_weight(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """Hugging Face's Llama RMSNorm: normalise in fp32, scale in the input dtype (one fused op in fp32,
    where the two are the same computation)."""
    dtype = x.dtype
    if dtype == torch.float32 and weight.dtype == torch.float32:
        return F.rms_norm(x, x.shape[-1:], weight, eps)
    h = x.float()
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
    return weight * h.to(dtype)


class Arch:
    """The attention shape of a supported model."""

    def __init__(self, model):
        c = model.config
        self.heads, self.kv_heads = c.num_attention_heads, c.num_key_value_heads
        self.head_dim = getattr(c, "head_dim", None) or c.hidden_size // c.num_attention_heads
        self.qk_norm = c.model_type == "qwen3"


def pair_order(w: torch.Tensor, heads: int) -> torch.Tensor:
    """Rows of a query/key projection (weight [heads*D, in], bias [heads*D], or a per-head norm weight
    [D] with heads=1) reordered within each head so that dims i and i + D/2, which rotary embedding
    rotates together, become adjacent: (0, D/2, 1, D/2+1, ...). Queries and keys in this order give
    the same dot products, and the rotation becomes one complex multiplication."""
    D = w.shape[0] // heads
    return w.reshape(heads, 2, D // 2, *w.shape[1:]).transpose(1, 2).reshape(w.shape)


def rotate_pairs(x: torch.Tensor, freqs: torch.Tensor) -> torch.Tensor:
    """Rotary embedding of x [..., D] in pair order: each (even, odd) pair times the complex
    cos + i sin of freqs [..., D/2] (broadcast). Computed in fp32 for other dtypes."""
    dtype = x.dtype
    pairs = torch.view_as_complex(x.float().reshape(*x.shape[:-1], -1, 2))
    return torch.view_as_real(pairs * freqs).reshape(x.shape).to(dtype)


class LayerWeights:
    """One decoder layer's weights arranged for decoding: queries, keys and values from one product
    (query and key rows in pair order), gate and up from one product. The packed copies live for
    one generate call (about 2/3 of a layer's weights)."""

    def __init__(self, arch: "Arch", layer):
        attn, mlp = layer.self_attn, layer.mlp
        q, k, v = attn.q_proj, attn.k_proj, attn.v_proj
        self.qkv = torch.cat([pair_order(q.weight, arch.heads), pair_order(k.weight, arch.kv_heads), v.weight])
        self.qkv_bias = None if q.bias is None else torch.cat(
            [pair_order(q.bias, arch.heads), pair_order(k.bias, arch.kv_heads), v.bias])
        self.q_norm = self.k_norm = None
        if arch.qk_norm:
            self.q_norm = (pair_order(attn.q_norm.weight, 1), attn.q_norm.variance_epsilon)
            self.k_norm = (pair_order(attn.k_norm.weight, 1), attn.k_norm.variance_epsilon)
        self.gate_up = torch.cat([mlp.gate_proj.weight, mlp.up_proj.weight])
        self.gate_up_bias = None if mlp.gate_proj.bias is None else torch.cat([mlp.gate_proj.bias, mlp.up_proj.bias])
        self.o, self.down = attn.o_proj, mlp.down_proj
        self.norm_in, self.norm_post = layer.input_layernorm, layer.post_attention_layernorm
        self.scaling = attn.scaling

    def native_tensors(self) -> list[torch.Tensor]:
        """The 12 tensors the CPU kernel takes per layer (rlft/rollout/csrc/decode_cpu.cpp), an empty
        tensor for an absent bias or norm."""
        none = torch.empty(0)
        q_norm, k_norm = (self.q_norm[0], self.k_norm[0]) if self.q_norm else (None, None)
        parts = [self.norm_in.weight, self.qkv, self.qkv_bias, q_norm, k_norm, self.o.weight, self.o.bias,
                 self.norm_post.weight, self.gate_up, self.gate_up_bias, self.down.weight, self.down.bias]
        return [none if p is None else p.detach().contiguous() for p in parts]


def native_unsupported(model, device: torch.device) -> str | None:
    """Why the CPU kernel cannot decode for `model` on `device` (None when it can), besides
    `unsupported` and the kernel being built: it runs fp32 on the CPU, with one RMSNorm epsilon."""
    if device.type != "cpu":
        return f"device {device.type} (the decoding kernel is CPU-only)"
    dtypes = {p.dtype for p in model.parameters()}
    if dtypes != {torch.float32}:
        return f"parameters in {', '.join(sorted(str(d).replace('torch.', '') for d in dtypes))} (the kernel is fp32)"
    eps = {m.variance_epsilon for m in model.modules() if hasattr(m, "variance_epsilon")}
    if len(eps) != 1:
        return f"RMSNorm epsilons {sorted(eps)} (the kernel takes one)"
    return None


def residual_linear(x: torch.Tensor, inp: torch.Tensor, lin: torch.nn.Linear) -> torch.Tensor:
    """x + lin(inp) for 2-D x and inp, in one product when the layer has no bias."""
    out = torch.addmm(x, inp, lin.weight.t())
    return out if lin.bias is None else out + lin.bias


class LeanDecoder:
    """One batch of sampling: prefill, then one token per step into a preallocated cache.

    Hidden states are kept 2-D ([rows * T, hidden]); keys are cached in pair order (see
    `pair_order`). `step` attends to the filled columns only (shapes change every step: the fast
    eager path). `fixed_step` is the same computation with fixed shapes (every column, masked; the
    new column chosen by a device tensor), which a CUDA graph can capture and replay;
    `FixedStepGraph` does that on a GPU."""

    def __init__(self, model, batch: int, max_len: int, device: torch.device, native=None):
        self.model, self.body, self.arch = model, model.model, Arch(model)
        self.native = native  # the CPU kernel module (rlft/rollout/native.py), or None
        self.batch, self.max_len = batch, max_len
        dtype = self.body.embed_tokens.weight.dtype
        shape = (batch, self.arch.kv_heads, max_len, self.arch.head_dim)
        # zeros, not empty: the fixed-shape step reads unfilled columns (masked, weight 0, but
        # garbage such as NaN would survive 0 * NaN). The kernel's caches are laid out at prefill.
        self.keys = [torch.zeros(shape, dtype=dtype, device=device) for _ in self.body.layers] if native is None else []
        self.values = [torch.zeros(shape, dtype=dtype, device=device) for _ in self.body.layers] if native is None else []
        with torch.no_grad():
            self.weights = [LayerWeights(self.arch, layer) for layer in self.body.layers]
            self.native_layers = [w.native_tensors() for w in self.weights] if native is not None else None
        self.length = 0  # cache columns filled
        # rotary rotations (complex, [max_len, D/2]) of every position this batch can reach
        cos, sin = rotary_table(model, max_len, torch.float32, device)
        half = self.arch.head_dim // 2
        self.freqs = torch.complex(cos[:, :half].contiguous(), sin[:, :half].contiguous())
        head = model.lm_head
        # suppressed tokens (the model's generation_config) as -inf in the LM head's bias
        suppress = list(getattr(model.generation_config, "suppress_tokens", None) or [])
        self.head_bias = head.bias
        if suppress:
            bias = torch.zeros(head.weight.shape[0], dtype=head.weight.dtype, device=device)
            bias[suppress] = -float("inf")
            self.head_bias = bias if head.bias is None else head.bias + bias

    def _layer(self, i: int, x: torch.Tensor, b: int, T: int, freqs: torch.Tensor, attend) -> torch.Tensor:
        """Decoder layer i on hidden states x [b*T, hidden]; freqs [b, 1, T, D/2]; attend(i, q, k, v)
        caches k, v [b, KV, T, D] and returns the attention output [b, H, T, D]."""
        w, arch = self.weights[i], self.arch
        H, KV, D = arch.heads, arch.kv_heads, arch.head_dim
        h = rms_norm(x, w.norm_in)
        y = F.linear(h, w.qkv, w.qkv_bias).view(b, T, H + 2 * KV, D).transpose(1, 2)  # [b, heads, T, D]
        qk, v = y[:, :H + KV], y[:, H + KV:]
        if w.q_norm is not None:
            qk = torch.cat([rms_norm_weight(qk[:, :H], *w.q_norm), rms_norm_weight(qk[:, H:], *w.k_norm)], 1)
        qk = rotate_pairs(qk, freqs)
        out = attend(i, qk[:, :H], qk[:, H:], v)
        x = residual_linear(x, out.transpose(1, 2).reshape(b * T, H * D), w.o)
        g = F.linear(rms_norm(x, w.norm_post), w.gate_up, w.gate_up_bias)
        inter = g.shape[-1] // 2
        return residual_linear(x, F.silu(g[:, :inter]) * g[:, inter:], w.down)

    def _logits(self, x_last: torch.Tensor) -> torch.Tensor:
        """Next-token logits [rows, V] (fp32), suppressed tokens -inf."""
        h = rms_norm(x_last, self.body.norm)
        return F.linear(h, self.model.lm_head.weight, self.head_bias).float()

    def prefill(self, ids: torch.Tensor, attn: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
        """Run the distinct prompts `ids` [u, P] (left-padded, mask `attn`), where batch row r
        samples prompt rows[r]: fills the first P cache columns of every row and returns the
        next-token logits [batch, V] (fp32)."""
        u, P = ids.shape
        positions = (attn.long().cumsum(-1) - 1).masked_fill(attn == 0, 1)
        causal = torch.ones(P, P, dtype=torch.bool, device=ids.device).tril()
        # a query sees earlier real tokens; a padding query sees itself, which keeps its output finite
        mask = ((causal & attn.bool()[:, None, :]) | torch.eye(P, dtype=torch.bool, device=ids.device))[:, None]
        freqs = self.freqs[positions][:, None]

        def attend(i, q, k, v):
            if self.native is not None:  # the kernel's cache: each prompt once, the rows' own columns apart
                keys = k.new_zeros(u, a.kv_heads, a.head_dim, kernel_columns(P))
                keys[..., :P] = k.transpose(-1, -2)
                self.keys_p.append(keys)
                self.values_p.append(v.contiguous())
            else:
                self.keys[i][:, :, :P] = k.index_select(0, rows)
                self.values[i][:, :, :P] = v.index_select(0, rows)
            return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=self.weights[i].scaling,
                                                  enable_gqa=self.arch.kv_heads != self.arch.heads)

        a = self.arch
        if self.native is not None:
            own = self.max_len - P
            self.keys_p, self.values_p = [], []
            self.prompt_of, self.prompt_bias = rows.contiguous(), key_bias(attn.bool())
            self.keys = [ids.new_zeros((self.batch, a.kv_heads, a.head_dim, kernel_columns(own)), dtype=torch.float32)
                         for _ in self.weights]
            self.values = [ids.new_zeros((self.batch, a.kv_heads, own, a.head_dim), dtype=torch.float32)
                           for _ in self.weights]
        x = self.body.embed_tokens(ids).view(u * P, -1)
        for i in range(len(self.weights)):
            x = self._layer(i, x, u, P, freqs, attend)
        self.length = P
        return self._logits(x.view(u, P, -1)[:, -1]).index_select(0, rows)

    def step(self, tokens: torch.Tensor, positions: torch.Tensor, key_mask: torch.Tensor | None) -> torch.Tensor:
        """Append one token per row (tokens [batch], their positions [batch]); `key_mask` [batch, L]
        marks the cache columns a row may attend to (None: all). Returns next-token logits."""
        return self.step_rotated(tokens, self.freqs[positions], key_mask)

    def step_rotated(self, tokens: torch.Tensor, freqs: torch.Tensor, key_mask: torch.Tensor | None) -> torch.Tensor:
        """`step` with the rows' rotary rotations freqs [batch, D/2] given (looked up in advance)."""
        if self.native is not None:  # the prompt's mask was set at prefill; a row's own columns are all visible
            return self.step_native(tokens, freqs.real.contiguous(), freqs.imag.contiguous())
        t, B = self.length, tokens.shape[0]
        mask = None if key_mask is None else key_mask[:, None, None, :t + 1]

        def attend(i, q, k, v):
            keys, values = self.keys[i], self.values[i]
            keys[:, :, t:t + 1], values[:, :, t:t + 1] = k, v
            return F.scaled_dot_product_attention(q, keys[:, :, :t + 1], values[:, :, :t + 1], attn_mask=mask,
                                                  scale=self.weights[i].scaling,
                                                  enable_gqa=self.arch.kv_heads != self.arch.heads)

        x = F.embedding(tokens, self.body.embed_tokens.weight)
        freqs = freqs[:, None, None]
        for i in range(len(self.weights)):
            x = self._layer(i, x, B, 1, freqs, attend)
        self.length = t + 1
        return self._logits(x)

    def step_native(self, tokens: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        """`step` by the CPU kernel (cos, sin [batch, D/2]: the rows' rotations), attending to the
        prompt's real tokens and all of the row's own."""
        a, w = self.arch, self.weights[0]
        x = F.embedding(tokens, self.body.embed_tokens.weight)
        head = self.model.lm_head
        own = self.length - self.values_p[0].shape[2]  # the row's own cache column to fill
        logits = self.native.decode_step(
            x, self.native_layers, self.keys_p, self.values_p, self.prompt_bias, self.prompt_of, self.keys,
            self.values, cos, sin, own, a.heads, a.kv_heads, a.head_dim, w.scaling, w.norm_in.variance_epsilon,
            self.body.norm.weight, head.weight, torch.empty(0) if self.head_bias is None else self.head_bias)
        self.length += 1
        return logits

    def fixed_step(self, tokens: torch.Tensor, positions: torch.Tensor, column: torch.Tensor,
                   visible: torch.Tensor) -> torch.Tensor:
        """`step` with fixed shapes: tokens, positions [B]; column [1] (long, on the device) is the
        cache column to fill; visible [B, L] (bool) is updated in place to include it. Attends over
        every column, masked. No host synchronisation and no shape that changes between steps."""
        B = tokens.shape[0]
        visible.index_fill_(1, column, True)
        mask = visible[:, None, None, :]

        def attend(i, q, k, v):
            self.keys[i].index_copy_(2, column, k)
            self.values[i].index_copy_(2, column, v)
            return F.scaled_dot_product_attention(q, self.keys[i], self.values[i], attn_mask=mask,
                                                  scale=self.weights[i].scaling,
                                                  enable_gqa=self.arch.kv_heads != self.arch.heads)

        x = F.embedding(tokens, self.body.embed_tokens.weight)
        freqs = self.freqs.index_select(0, positions)[:, None, None]
        for i in range(len(self.weights)):
            x = self._layer(i, x, B, 1, freqs, attend)
        return self._logits(x)


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


def kernel_columns(columns: int) -> int:
    """Key columns the kernel allocates for `columns`: a multiple of 16 (it reads whole blocks)."""
    return -(-columns // 16) * 16


def key_bias(key_mask: torch.Tensor) -> torch.Tensor:
    """A boolean key mask [B, L] as the kernel's additive bias (0 / -inf); empty when all is visible."""
    if bool(key_mask.all()):
        return torch.empty(0)
    return torch.zeros(key_mask.shape, device=key_mask.device).masked_fill_(~key_mask, -float("inf"))


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


NOISE_CHUNK_BYTES = 64 * 2**20  # Gumbel noise is drawn for as many steps at once as fit here
GPU_CHECK_EVERY = 16  # on a GPU, whether every row has ended is read back every this many steps


@torch.no_grad()
def lean_generate(model, ids: torch.Tensor, attn: torch.Tensor, max_new_tokens: int, do_sample: bool,
                  temperature: float, top_k: int, top_p: float, eos_id: int, pad_id: int,
                  cuda_graph: bool = False, check_every: int | None = None, native=None) -> torch.Tensor:
    """New tokens [B, <= max_new_tokens] for the left-padded prompts `ids`/`attn`, PAD after a row's
    EOS (Hugging Face generate's output past the prompt). Stops when every row has ended.
    `cuda_graph` (CUDA devices only): decode with the fixed-shape step replayed from a CUDA graph.
    `check_every`: read back whether every row has ended every this many steps (default: every step
    on CPU; GPU_CHECK_EVERY on a GPU, where a read-back each step would stall the device); steps run
    past the end are trimmed, so the output is the same. `native`: the CPU kernel module
    (rlft/rollout/native.py) to decode with, or None for the PyTorch step."""
    B, P = ids.shape
    N, device = max_new_tokens, ids.device
    if N <= 0:
        return torch.full((B, 0), pad_id, dtype=torch.long, device=device)
    decoder = LeanDecoder(model, B, P + N, device, native=native)
    unique_ids, unique_attn, rows = distinct_rows(ids, attn)
    logits = decoder.prefill(unique_ids, unique_attn, rows)
    key_mask = None
    if bool((attn == 0).any()):
        key_mask = torch.ones(B, P + N, dtype=torch.bool, device=device)
        key_mask[:, :P] = attn.bool()
    positions = attn.long().sum(-1)  # the next token's position: real tokens so far
    freqs = decoder.freqs[positions[:, None] + torch.arange(N, device=device)]  # [B, N, D/2]: step s's rotations
    step = lambda tok, s: decoder.step_rotated(tok, freqs[:, s], key_mask)  # noqa: E731
    if native is not None:
        by_step = freqs.transpose(0, 1)  # [N, B, D/2]: each step's rotations contiguous
        cos, sin = by_step.real.contiguous(), by_step.imag.contiguous()
        step = lambda tok, s: decoder.step_native(tok, cos[s], sin[s])  # noqa: E731
    if cuda_graph and device.type == "cuda" and N > 1:
        visible = torch.zeros(B, P + N, dtype=torch.bool, device=device)
        visible[:, :P] = attn.bool()
        graph = FixedStepGraph(decoder, visible, P)
        step = lambda tok, s: graph.step(tok, positions + s, P + s)  # noqa: E731
    warpers = logits_warpers(temperature, top_k, top_p) if do_sample else []
    chunk = max(1, NOISE_CHUNK_BYTES // (B * logits.shape[-1] * 4))
    check_every = check_every or (1 if device.type == "cpu" else GPU_CHECK_EVERY)
    tokens = []
    done = torch.zeros(B, dtype=torch.bool, device=device)
    for s in range(N):
        for warp in warpers:
            logits = warp(None, logits)
        if do_sample:
            if s % chunk == 0:
                noise = gumbel_noise((min(chunk, N - s), B, logits.shape[-1]), device)
            token = (logits + noise[s % chunk]).argmax(-1)
        else:
            token = logits.argmax(-1)
        tokens.append(token)
        done |= token == eos_id
        if s == N - 1 or ((s + 1) % check_every == 0 and bool(done.all())):
            break
        logits = step(token, s)
    out = torch.stack(tokens, 1)
    eos = out == eos_id
    ended = eos.cumsum(1)
    out = out.masked_fill(ended > eos.long(), pad_id)  # PAD after each row's first EOS
    all_ended = (ended > 0).all(0).nonzero()
    return out[:, :int(all_ended[0]) + 1] if len(all_ended) else out  # up to the step where the last row ended
