"""Memory per rank of a training stage, from arithmetic: what a user needs before renting GPUs.

Model states (bytes per parameter, divided over the ranks that shard them):

    weights      2 (bf16) or 4 (fp32) x all parameters         sharded by ZeRO-3
                 (QLoRA: the linear maps' in NF4, about 0.516 bytes each)
    fp32 master  4 x trainable (bf16; and fp32 under ZeRO 1-3:  sharded by ZeRO 1-3
                 DeepSpeed keeps a separate fp32 partition)
    gradients    2 or 4 x trainable (4 under ZeRO-3, which       sharded by ZeRO 2-3
                 accumulates its partition in fp32)
    Adam         8 x trainable (two fp32 moments)               sharded by ZeRO 1-3 (CPU with offload)
    reference    the weights again (RL with a KL term, full fine-tuning; LoRA's reference is the base
                 model with the adapter off, no copy)
    teacher      on-policy distillation: the teacher's weights (its own parameter count)  sharded by ZeRO-3

    ZeRO-3 live gathered parameters that DeepSpeed keeps between uses, up to
                 stage3_max_live_parameters (1e9 by default: a model under 1B parameters stays whole)

and, per phase, what exists only for a while:

    generation   ZeRO-3 gathers the whole policy once for the phase (weights again, whole) + KV cache
                 (2 x layers x kv-width x sequences x positions)
    optimizer    ZeRO 1-3 flatten the rank's fp32 gradient partition and Adam makes temporaries of it:
    step         3 x 4 bytes x trainable / ranks (measured on DeepSpeed's ZeRO-3 step; ZeRO-3 steps one
                 sub-group of deepspeed.zero3_sub_group_elements at a time)
    training     activations (without checkpointing: every layer's saved tensors, about
                 11 hidden + 4 intermediate values per token; with it: one hidden vector per layer and
                 token, plus one layer's tensors while it is recomputed) and the LM head's logits: one
                 chunk of train.logit_chunk_tokens loss tokens at a time (rlft/rollout/lm_head.py: the
                 chunk's logits, their fp32 copy, the softmax temporaries and their gradients: (2 x
                 weight bytes + 16) x chunk x vocab; a per-token loss differentiated in the forward
                 also holds the head's weight gradient and the loss tokens' hidden-state gradients
                 until the backward, where the head is trainable and not under ZeRO-3); with
                 logit_chunk_tokens=0 the micro-batch's fp32 logits and their gradient, and two
                 temporaries of one log-softmax chunk (4 x tokens x vocab x 4 bytes up to
                 rlft.rollout.logprobs.CHUNK_BYTES)
    export       rank 0 gathers (ZeRO-3) or merges (LoRA) a full copy of the weights to write final/ (host
                 memory: counts only on a CPU run)

The peak is the states plus the largest phase, plus the process's own footprint (the runtime: CUDA
context, or on CPU the interpreter with torch, transformers and deepspeed loaded), which the caller
measures or assumes. `scripts/scale_check.sh` compares this with measured peaks; docs/performance.md
tabulates it for 0.5B, 1.5B and 7B models.
"""
from __future__ import annotations

from dataclasses import dataclass, field

GiB = 2**30
# QLoRA's NF4 weights with double quantization (blocks of 64, their absmax in 8 bits, blocks of 256 of those
# with an fp32 absmax): 4 bits + 8/64 + 32/(64 x 256) bits per parameter
NF4_BYTES = 0.5 + 1 / 64 + 4 / (64 * 256)
CHUNK_BYTES = 2**29  # rlft.rollout.logprobs.CHUNK_BYTES: fp32 log-softmax rows at a time


@dataclass(frozen=True)
class Shape:
    """A decoder-only transformer's dimensions."""
    layers: int
    hidden: int
    intermediate: int
    heads: int
    kv_heads: int
    vocab: int
    tied: bool = True

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads

    @property
    def params(self) -> int:
        """Parameters of a Llama/Qwen2-style model (q/k/v biases as Qwen2 has them)."""
        kv = self.kv_heads * self.head_dim
        attn = self.hidden * (self.hidden + 2 * kv) + (self.hidden + 2 * kv) + self.hidden * self.hidden
        mlp = 3 * self.hidden * self.intermediate
        per_layer = attn + mlp + 2 * self.hidden
        embed = self.vocab * self.hidden
        return self.layers * per_layer + embed * (1 if self.tied else 2) + self.hidden

    @property
    def linear_params(self) -> int:
        """Weights of the layers' linear maps (attention and MLP): what QLoRA stores in 4 bits."""
        kv = self.kv_heads * self.head_dim
        return self.layers * (self.hidden * (self.hidden + 2 * kv) + self.hidden * self.hidden
                              + 3 * self.hidden * self.intermediate)

    def lora_params(self, rank: int, targets: tuple[str, ...] = ("q_proj", "k_proj", "v_proj", "o_proj")) -> int:
        """Adapter parameters: rank x (in + out) per adapted matrix and layer."""
        kv = self.kv_heads * self.head_dim
        dims = {"q_proj": (self.hidden, self.hidden), "k_proj": (self.hidden, kv), "v_proj": (self.hidden, kv),
                "o_proj": (self.hidden, self.hidden), "gate_proj": (self.hidden, self.intermediate),
                "up_proj": (self.hidden, self.intermediate), "down_proj": (self.intermediate, self.hidden)}
        return self.layers * sum(rank * sum(dims[t]) for t in targets)


SHAPES = {  # the published configurations (Qwen2.5 base/instruct)
    "qwen2.5-0.5b": Shape(layers=24, hidden=896, intermediate=4864, heads=14, kv_heads=2, vocab=151936),
    "qwen2.5-1.5b": Shape(layers=28, hidden=1536, intermediate=8960, heads=12, kv_heads=2, vocab=151936),
    "qwen2.5-7b": Shape(layers=28, hidden=3584, intermediate=18944, heads=28, kv_heads=4, vocab=152064, tied=False),
}


@dataclass(frozen=True)
class Setup:
    """How a stage runs: sharding, precision, adapter, and the largest micro-batch and generation batch."""
    world: int = 1
    zero_stage: int = 0
    precision: str = "bf16"  # bf16 | fp32
    lora_rank: int = 0
    lora_targets: tuple[str, ...] = ("q_proj", "k_proj", "v_proj", "o_proj")
    load_in_4bit: bool = False  # QLoRA: the layers' linear weights in NF4 (model.lora.load_in_4bit)
    offload_optimizer: bool = False
    reference: bool = False  # an RL stage with a KL term (needs the reference's log-probs)
    teacher_params: int = 0  # on-policy distillation: the teacher's parameters (0: no teacher)
    activation_checkpointing: bool = False
    micro_batch_tokens: int = 0  # positions of one training micro-batch (sequences x padded length)
    loss_tokens: int = 0  # of those, the ones whose logits are computed (responses)
    logit_chunk_tokens: int | None = None  # train.logit_chunk_tokens: loss tokens whose logits exist at once
    # (None: lm_head.default_chunk_tokens of the vocabulary; 0: all)
    generate_sequences: int = 0  # sequences generated at once (0: no generation, e.g. SFT)
    generate_positions: int = 0  # prompt + new tokens of each
    zero3_sub_group_elements: int = 10**9  # ZeRO-3 optimizer-step sub-group (deepspeed.zero3_sub_group_elements)
    zero3_live_parameters: int = 10**9  # ZeRO-3 gathered elements kept between uses (deepspeed.zero3_live_parameters)
    bucket_elements: int = 0  # ZeRO-2/3 reduce bucket (rlft.deepspeed.bucket_elements); 0 = hidden², >= 2^20
    runtime_bytes: int = 0  # the process's own footprint


@dataclass
class Estimate:
    """Bytes per rank by component; `peak` is the states plus the largest phase plus the runtime."""
    parts: dict[str, float] = field(default_factory=dict)
    phases: dict[str, float] = field(default_factory=dict)
    runtime: float = 0.0

    @property
    def states(self) -> float:
        return sum(self.parts.values())

    @property
    def peak(self) -> float:
        return self.runtime + self.states + max(self.phases.values(), default=0.0)

    @property
    def peak_phase(self) -> str:
        return max(self.phases, key=self.phases.get) if self.phases else ""


def estimate(shape: Shape, s: Setup, cpu: bool = False, rank0: bool = True) -> Estimate:
    """Peak memory per rank (module docstring) on a GPU, or with `cpu` on a CPU-only run, where the
    offloaded optimizer state (fp32 master, gradients, Adam) and rank 0's gathered export copy live in
    the same memory as everything else. `rank0`: the rank that writes final/ (the others skip the export)."""
    wb = 2 if s.precision == "bf16" else 4
    P = shape.params
    lora = s.lora_rank > 0
    T = shape.lora_params(s.lora_rank, s.lora_targets) if lora else P
    n, z = s.world, s.zero_stage
    shard3 = n if z == 3 else 1
    on_host = s.offload_optimizer and z >= 1 and not cpu  # ZeRO-Offload: these live in CPU memory
    est = Estimate(runtime=float(s.runtime_bytes))
    est.parts["weights"] = P * wb / shard3
    if s.load_in_4bit:  # ZeRO-3 is refused with 4-bit weights
        est.parts["weights"] = (P - shape.linear_params) * wb + shape.linear_params * NF4_BYTES
    if lora:
        est.parts["weights"] += T * 4  # the adapter in fp32 beside the (frozen) base
    master = s.precision == "bf16" or z >= 1
    est.parts["fp32 master"] = 0.0 if (on_host or not master) else T * 4 / (n if z >= 1 else 1)
    est.parts["gradients"] = 0.0 if on_host else T * (4 if z == 3 else wb) / (n if z >= 2 else 1)
    est.parts["Adam"] = 0.0 if on_host else T * 8 / (n if z >= 1 else 1)
    est.parts["reference"] = P * wb / shard3 if (s.reference and not lora) else 0.0
    est.parts["teacher"] = s.teacher_params * wb / shard3  # frozen, loaded like the reference (even beside LoRA)
    if z >= 2 and not lora:
        bucket = s.bucket_elements or max(shape.hidden ** 2, 2**20)
        est.parts["reduce bucket"] = min(bucket, T) * 4
    live = min(P, s.zero3_live_parameters) * wb if z == 3 else 0.0
    est.parts["ZeRO-3 live parameters"] = live
    # the update: ZeRO 1-3 flatten this rank's fp32 gradient partition (ZeRO-3: one sub-group at a time) and
    # Adam makes temporaries of it (3 x its size, measured on DeepSpeed's ZeRO-3 step); without ZeRO Adam's
    # one temporary per tensor
    if not on_host:
        part = T / n if z >= 1 else T / 3
        est.phases["optimizer step"] = 3 * 4 * (min(part, s.zero3_sub_group_elements) if z == 3 else part)
    kv_width = shape.kv_heads * shape.head_dim
    if s.generate_sequences:
        kv = 2 * shape.layers * kv_width * s.generate_sequences * s.generate_positions * wb
        est.phases["generation"] = kv + (P * wb - live if z == 3 else 0.0)
    if s.micro_batch_tokens:
        per_layer = (11 * shape.hidden + 4 * shape.intermediate) * wb  # saved tensors per token and layer
        if s.activation_checkpointing:
            acts = s.micro_batch_tokens * (shape.layers * shape.hidden * wb + per_layer)
        else:
            acts = s.micro_batch_tokens * shape.layers * per_layer
        chunk = s.logit_chunk_tokens
        if chunk is None:
            from rlft.rollout.lm_head import default_chunk_tokens  # torch only where the default is asked for

            chunk = default_chunk_tokens(shape.vocab)
        if chunk:
            head = min(s.loss_tokens, chunk) * shape.vocab * (2 * wb + 16)
            if not lora and z < 3:  # head_loss: the head's gradient, computed in the forward, held for the backward
                head += shape.vocab * shape.hidden * wb + s.loss_tokens * shape.hidden * wb
        else:
            logits = s.loss_tokens * shape.vocab * 4
            head = 2 * logits + 2 * min(logits, CHUNK_BYTES)
        gathered_layer = (P - shape.vocab * shape.hidden) / shape.layers * wb if z == 3 else 0.0
        est.phases["training"] = acts + head + gathered_layer
    if cpu and rank0:  # rank 0 gathers (ZeRO-3) or merges (LoRA) a full copy to write final/; on a GPU run it is host memory
        est.phases["export"] = P * wb * (1 if z == 3 else 0) + (P * wb if lora else 0)
    return est
