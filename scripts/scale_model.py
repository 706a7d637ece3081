#!/usr/bin/env python3
"""Write a local Hugging Face model directory with a real model's architecture and vocabulary size,
random weights, and a tokenizer of that vocabulary size with a chat template — nothing downloaded.

    python scripts/scale_model.py --shape qwen2.5-0.5b --out runs/scale/qwen2.5-0.5b-shape

The tokenizer is the built-in character-level one (one token per printable character, so the
built-in task's text encodes as it does for the tiny model) with its vocabulary filled up to the
model's size by never-produced filler tokens, plus ChatML's two special tokens and a ChatML chat
template (Qwen's format): prompts are rendered through the template, responses end with
`<|im_end|>`. The directory loads with `AutoModelForCausalLM` / `AutoTokenizer` like any checkpoint,
so `rlft train model=hf model.path=<dir>` trains it.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

# Architectures (configs of the published models; the weights here are random).
SHAPES = {
    "qwen2.5-0.5b": dict(vocab_size=151936, hidden_size=896, intermediate_size=4864, num_hidden_layers=24,
                         num_attention_heads=14, num_key_value_heads=2, tie_word_embeddings=True),
    "qwen2.5-1.5b": dict(vocab_size=151936, hidden_size=1536, intermediate_size=8960, num_hidden_layers=28,
                         num_attention_heads=12, num_key_value_heads=2, tie_word_embeddings=True),
    "qwen2.5-7b": dict(vocab_size=152064, hidden_size=3584, intermediate_size=18944, num_hidden_layers=28,
                       num_attention_heads=28, num_key_value_heads=4, tie_word_embeddings=False),
    # the 0.5B model's vocabulary on a small width: the same script, in seconds (tests)
    "qwen2.5-vocab-small": dict(vocab_size=151936, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=True),
}
END_OF_TEXT, IM_START, IM_END = "<|endoftext|>", "<|im_start|>", "<|im_end|>"
CHAT_TEMPLATE = ("{% for message in messages %}" + IM_START + "{{ message['role'] }}\n{{ message['content'] }}"
                 + IM_END + "\n{% endfor %}{% if add_generation_prompt %}" + IM_START + "assistant\n{% endif %}")


def byte_symbols() -> list[str]:
    """The 256 printable stand-ins of byte-level BPE (GPT-2's byte-to-unicode table), in byte order."""
    printable = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) \
        + list(range(ord("®"), ord("ÿ") + 1))
    table, extra = {}, 0
    for b in range(256):
        if b in printable:
            table[b] = chr(b)
        else:
            table[b] = chr(256 + extra)
            extra += 1
    return [table[b] for b in range(256)]


def build_tokenizer(vocab_size: int):
    """A byte-level BPE tokenizer of Qwen2's kind with `vocab_size` entries and no merges (module docstring)."""
    from transformers import Qwen2Tokenizer

    vocab = {symbol: i for i, symbol in enumerate(byte_symbols())}
    specials = [END_OF_TEXT, IM_START, IM_END]
    fill = vocab_size - len(vocab) - len(specials)
    if fill < 0:
        raise SystemExit(f"scale_model: vocabulary size {vocab_size} is below {len(vocab) + len(specials)}")
    vocab.update({f"<|fill_{i}|>": len(vocab) + i for i in range(fill)})
    vocab.update({tok: len(vocab) + i for i, tok in enumerate(specials)})
    tok = Qwen2Tokenizer(vocab=vocab, merges=[], unk_token=None, pad_token=END_OF_TEXT, eos_token=IM_END,
                         additional_special_tokens=[IM_START, IM_END], model_max_length=4096)
    tok.chat_template = CHAT_TEMPLATE
    assert len(tok) == vocab_size, (len(tok), vocab_size)
    return tok


def build(shape: str, out: Path, seed: int = 0) -> Path:
    """Write the model directory (skipped when it is already complete); returns it."""
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    out = Path(out)
    if (out / "config.json").is_file() and (out / "tokenizer.json").is_file() and any(out.glob("*.safetensors")):
        return out
    tok = build_tokenizer(SHAPES[shape]["vocab_size"])
    config = Qwen2Config(**SHAPES[shape], max_position_embeddings=32768, rope_theta=1e6, rms_norm_eps=1e-6,
                         pad_token_id=tok.pad_token_id, eos_token_id=tok.eos_token_id, bos_token_id=None)
    torch.manual_seed(seed)
    model = Qwen2ForCausalLM(config)
    tmp = out.with_name(out.name + ".tmp")
    model.save_pretrained(tmp, safe_serialization=True)
    tok.save_pretrained(tmp)
    (tmp / "shape.json").write_text(json.dumps({"shape": shape, "parameters": sum(p.numel() for p in model.parameters()),
                                                "seed": seed}))
    tmp.rename(out)
    return out


def main(argv: list[str]) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--shape", choices=sorted(SHAPES), default="qwen2.5-0.5b")
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    print(build(args.shape, args.out, args.seed))


if __name__ == "__main__":
    main(sys.argv[1:])
