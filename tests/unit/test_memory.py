"""The memory arithmetic (rlft.memory): parameter counts against the real model classes, and the
bytes-per-parameter rules of each ZeRO stage, precision, LoRA and offload."""
import pytest

from rlft import memory
from rlft.rollout import lm_head

SMALL = memory.Shape(layers=2, hidden=64, intermediate=96, heads=4, kv_heads=2, vocab=300)


def qwen2(shape: memory.Shape):
    from transformers import Qwen2Config, Qwen2ForCausalLM

    return Qwen2ForCausalLM(Qwen2Config(vocab_size=shape.vocab, hidden_size=shape.hidden,
                                        intermediate_size=shape.intermediate, num_hidden_layers=shape.layers,
                                        num_attention_heads=shape.heads, num_key_value_heads=shape.kv_heads,
                                        tie_word_embeddings=shape.tied))


@pytest.mark.parametrize("tied", [True, False])
def test_parameter_count_matches_transformers(tied):
    shape = memory.Shape(**{**SMALL.__dict__, "tied": tied})
    model = qwen2(shape)
    assert shape.params == sum(p.numel() for p in model.parameters())


def test_published_shapes_have_their_parameter_counts():
    assert memory.SHAPES["qwen2.5-0.5b"].params == 494_032_768  # Qwen2.5-0.5B's model card: 0.49B
    assert 1.50e9 < memory.SHAPES["qwen2.5-1.5b"].params < 1.56e9
    assert 7.5e9 < memory.SHAPES["qwen2.5-7b"].params < 7.7e9  # 7.61B


def test_lora_parameter_count_matches_peft():
    from peft import LoraConfig, get_peft_model

    targets = ("q_proj", "v_proj", "down_proj")
    model = get_peft_model(qwen2(SMALL), LoraConfig(r=8, target_modules=list(targets)))
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    assert SMALL.lora_params(8, targets) == trainable


def states_per_param(setup: memory.Setup, shape=SMALL) -> float:
    return memory.estimate(shape, setup).states / shape.params


def test_bytes_per_parameter_of_each_zero_stage():
    # mixed precision on one rank: bf16 weights 2 + fp32 master 4 + bf16 gradients 2 + Adam 8 = 16
    assert states_per_param(memory.Setup(precision="bf16")) == pytest.approx(16)
    # ZeRO-3 on 8 ranks shards all of it (and accumulates gradients in fp32)
    z3 = memory.estimate(SMALL, memory.Setup(precision="bf16", zero_stage=3, world=8, bucket_elements=1,
                                             zero3_live_parameters=0))
    assert (z3.states - z3.parts["reduce bucket"]) / SMALL.params == pytest.approx((2 + 4 + 4 + 8) / 8)
    # by default DeepSpeed keeps up to 1e9 gathered elements live: a small model whole
    z3_live = memory.estimate(SMALL, memory.Setup(precision="bf16", zero_stage=3, world=8))
    assert z3_live.parts["ZeRO-3 live parameters"] == 2 * SMALL.params
    # ZeRO-1 shards optimizer state and master only, ZeRO-2 the gradients too
    z1 = memory.estimate(SMALL, memory.Setup(precision="bf16", zero_stage=1, world=4))
    assert z1.states / SMALL.params == pytest.approx(2 + 2 + (4 + 8) / 4)
    z2 = memory.estimate(SMALL, memory.Setup(precision="bf16", zero_stage=2, world=4, bucket_elements=1))
    assert (z2.states - z2.parts["reduce bucket"]) / SMALL.params == pytest.approx(2 + (2 + 4 + 8) / 4)
    # fp32 without ZeRO: the optimizer updates the weights themselves, no master copy
    assert states_per_param(memory.Setup(precision="fp32")) == pytest.approx(4 + 4 + 8)


def test_reference_lora_and_offload():
    full = memory.estimate(SMALL, memory.Setup(precision="bf16", reference=True))
    assert full.parts["reference"] == 2 * SMALL.params
    lora = memory.estimate(SMALL, memory.Setup(precision="bf16", reference=True, lora_rank=4))
    assert lora.parts["reference"] == 0  # the base model with the adapter off
    assert lora.parts["Adam"] == 8 * SMALL.lora_params(4)
    off = memory.estimate(SMALL, memory.Setup(precision="bf16", zero_stage=2, offload_optimizer=True))
    assert off.parts["Adam"] == 0
    assert off.parts["fp32 master"] == 0 and off.parts["gradients"] == 0  # ZeRO-Offload keeps them on the host
    on_cpu = memory.estimate(SMALL, memory.Setup(precision="bf16", zero_stage=2, offload_optimizer=True), cpu=True)
    assert on_cpu.parts["Adam"] == 8 * SMALL.params  # a CPU run: the host is the device
    # a distillation teacher: its own weights, beside a LoRA student too, sharded by ZeRO-3 only
    teacher = memory.Setup(precision="bf16", lora_rank=4, teacher_params=3 * SMALL.params)
    assert memory.estimate(SMALL, teacher).parts["teacher"] == 2 * 3 * SMALL.params
    sharded = memory.Setup(precision="bf16", zero_stage=3, world=2, teacher_params=3 * SMALL.params)
    assert memory.estimate(SMALL, sharded).parts["teacher"] == 3 * SMALL.params


def test_phases_and_peak():
    s = memory.Setup(precision="fp32", zero_stage=3, world=2, micro_batch_tokens=400, loss_tokens=100,
                     generate_sequences=16, generate_positions=128, runtime_bytes=10**9)
    est = memory.estimate(SMALL, s)
    kv = 2 * SMALL.layers * SMALL.kv_heads * SMALL.head_dim * 16 * 128 * 4
    # the whole policy gathered beside the shards, less what is live anyway
    assert est.phases["generation"] == pytest.approx(kv + SMALL.params * 4 - est.parts["ZeRO-3 live parameters"])
    assert est.phases["optimizer step"] == pytest.approx(3 * 4 * SMALL.params / 2)
    logits = 100 * SMALL.vocab * 4
    whole = memory.estimate(SMALL, memory.Setup(**{**s.__dict__, "logit_chunk_tokens": 0}))
    assert whole.phases["training"] > 4 * logits  # the micro-batch's fp32 logits, their gradient, temporaries
    chunked = memory.estimate(SMALL, memory.Setup(**{**s.__dict__, "logit_chunk_tokens": 25}))
    assert whole.phases["training"] - chunked.phases["training"] == pytest.approx(
        4 * logits - 25 * SMALL.vocab * (2 * 4 + 16))  # one chunk's logits and gradients instead
    by_vocab = memory.estimate(SMALL, memory.Setup(**{**s.__dict__, "logit_chunk_tokens": lm_head.default_chunk_tokens(
        SMALL.vocab)}))
    assert est.phases["training"] == by_vocab.phases["training"]  # null: the chunk the LM head takes for the vocabulary
    assert est.peak == pytest.approx(10**9 + est.states + max(est.phases.values()))
    assert est.peak_phase == max(est.phases, key=est.phases.get)
    checkpointed = memory.estimate(SMALL, memory.Setup(**{**s.__dict__, "activation_checkpointing": True}))
    assert checkpointed.phases["training"] < est.phases["training"]


def test_qlora_weights_match_a_model_loaded_in_4_bits(tmp_path):
    """The NF4 arithmetic against transformers + bitsandbytes: the bytes of a model loaded in 4 bits (its
    parameters plus each 4-bit weight's double-quantized block statistics)."""
    pytest.importorskip("bitsandbytes", reason="QLoRA needs bitsandbytes (installed by .[test])")
    import torch
    from transformers import AutoModelForCausalLM

    from rlft import lora

    shape = memory.Shape(layers=2, hidden=256, intermediate=512, heads=4, kv_heads=2, vocab=1000)
    qwen2(shape).save_pretrained(tmp_path)
    model = AutoModelForCausalLM.from_pretrained(tmp_path, quantization_config=lora.quantization_config(torch.float32),
                                                 device_map={"": "cpu"})
    measured = 0
    for p in model.parameters():
        measured += p.numel() * p.element_size()
        if lora.is_4bit(p):
            state = p.quant_state
            measured += state.absmax.numel() * state.absmax.element_size()
            measured += state.state2.absmax.numel() * state.state2.absmax.element_size() if state.nested else 0
    predicted = memory.estimate(shape, memory.Setup(precision="fp32", load_in_4bit=True)).parts["weights"]
    assert predicted == pytest.approx(measured, rel=0.01)
    full = memory.estimate(shape, memory.Setup(precision="fp32")).parts["weights"]
    assert predicted < 0.45 * full
