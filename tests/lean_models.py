"""Tiny random Llama-family models (every architecture the lean paths support) and their tokenizer."""
from __future__ import annotations

import torch
from transformers import (LlamaConfig, LlamaForCausalLM, MistralConfig, MistralForCausalLM, Qwen2Config,
                          Qwen2ForCausalLM, Qwen3Config, Qwen3ForCausalLM)

from rlft.data.tokenizer import build_char_tokenizer

TOK = build_char_tokenizer()
SPECIAL = dict(pad_token_id=TOK.pad_token_id, eos_token_id=TOK.eos_token_id, bos_token_id=TOK.bos_token_id)
SHAPE = dict(vocab_size=len(TOK), hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
             max_position_embeddings=256)
MODELS = {
    "llama": lambda: LlamaForCausalLM(LlamaConfig(**SHAPE, num_key_value_heads=4, **SPECIAL)),
    "llama-gqa-untied": lambda: LlamaForCausalLM(LlamaConfig(**SHAPE, num_key_value_heads=2, tie_word_embeddings=False,
                                                             rope_theta=500.0, **SPECIAL)),
    "qwen2": lambda: Qwen2ForCausalLM(Qwen2Config(**SHAPE, num_key_value_heads=2, **SPECIAL)),
    "qwen3": lambda: Qwen3ForCausalLM(Qwen3Config(**SHAPE, num_key_value_heads=2, head_dim=32, **SPECIAL)),
    "mistral": lambda: MistralForCausalLM(MistralConfig(**SHAPE, num_key_value_heads=2, sliding_window=4096,
                                                        **SPECIAL)),
}

def build(name: str, seed: int = 0):
    torch.manual_seed(seed)
    model = MODELS[name]().eval()
    with torch.no_grad():  # random biases too (HF initialises them to zero), so the test sees them
        for n, p in model.named_parameters():
            if n.endswith("bias") or "norm" in n:
                p.add_(torch.randn_like(p) * 0.1)
    return model
