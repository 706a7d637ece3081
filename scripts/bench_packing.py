#!/usr/bin/env python3
"""Padded against packed (train.packing) RL update forwards on a real rollout's token lengths.

    python scripts/bench_packing.py --samples runs/rl_table/eval/sft/samples.jsonl --model runs/rl_table/sft/final
    python scripts/bench_packing.py ... --width 512 --layers 8     # a wider random model, same lengths

The workload is GRPO's update on the built-in task: --prompts prompts x their sampled completions
(an `rlft eval` samples.jsonl: its prompts rendered with the chat template of the model's tokenizer,
its completions tokenized), right-padded as a rollout, in micro-batches of --micro sequences. Each
repetition times one update pass (forward, the policy-gradient loss on response tokens, backward) padded
and then packed, on one CPU thread; prints the padding share of the padded micro-batches, the tokens
each computes, the median seconds of each and the speed-up.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time

import torch


def load(args):
    from transformers import AutoModelForCausalLM, AutoTokenizer, LlamaConfig

    tok = AutoTokenizer.from_pretrained(args.model)
    model = AutoModelForCausalLM.from_pretrained(args.model)
    if args.width:
        cfg = LlamaConfig(vocab_size=model.config.vocab_size, hidden_size=args.width, intermediate_size=2 * args.width,
                          num_hidden_layers=args.layers, num_attention_heads=args.width // 64,
                          num_key_value_heads=args.width // 64, max_position_embeddings=512, tie_word_embeddings=True)
        torch.manual_seed(0)
        model = AutoModelForCausalLM.from_config(cfg)
    return tok, model


def rollout(tok, args):
    """(input_ids, attention_mask, response mask) of the file's first --prompts prompts x their samples."""
    from rlft.rollout.batch import build_sequences

    prompts, completions = [], []
    with open(args.samples) as f:
        for line, _ in zip(f, range(args.prompts)):
            rec = json.loads(line)
            text = tok.apply_chat_template([{"role": "user", "content": rec["prompt"]}], tokenize=False,
                                           add_generation_prompt=True) if tok.chat_template else rec["prompt"]
            p = tok(text, add_special_tokens=False)["input_ids"]
            for s in rec["samples"]:
                prompts.append(p)
                completions.append(tok(s["text"], add_special_tokens=False)["input_ids"] + [tok.eos_token_id])
    return build_sequences(prompts, completions, tok.pad_token_id)


def update_pass(model, ids, attn, mask, micro: int, packed: bool) -> float:
    """Seconds for forward + loss + backward over every micro-batch (gradients discarded)."""
    from rlft.rollout.logprobs import forward_logits, packed_logp, response_start, selective_logp

    tic = time.perf_counter()
    for i in range(0, len(ids), micro):
        width = int(attn[i:i + micro].sum(-1).max())
        b_ids, b_attn, b_mask = ids[i:i + micro, :width], attn[i:i + micro, :width], mask[i:i + micro, :width - 1]
        if packed:
            logp = packed_logp(model, b_ids, b_attn, b_mask)
        else:
            start = response_start(b_mask)
            logp = selective_logp(forward_logits(model, b_ids, b_attn, start), b_ids[:, start + 1:])
            b_mask = b_mask[:, start:]
        (-(logp * b_mask).sum() / b_mask.sum()).backward()
    model.zero_grad(set_to_none=True)
    return time.perf_counter() - tic


def main(argv: list[str]) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--samples", required=True, help="an rlft eval samples.jsonl (prompts and sampled completions)")
    p.add_argument("--model", required=True, help="a Hugging Face model directory (its tokenizer is used)")
    p.add_argument("--prompts", type=int, default=32, help="prompts of the rollout (x their samples)")
    p.add_argument("--micro", type=int, default=64, help="sequences per micro-batch")
    p.add_argument("--repeats", type=int, default=7, help="timed repetitions (after one warm-up)")
    p.add_argument("--width", type=int, default=0, help="a random model of this hidden size instead (0: the model)")
    p.add_argument("--layers", type=int, default=8, help="layers of the random model")
    args = p.parse_args(argv)
    torch.set_num_threads(1)
    tok, model = load(args)
    ids, attn, mask = rollout(tok, args)
    padded_positions = sum(int(attn[i:i + args.micro].sum(-1).max()) * len(attn[i:i + args.micro])
                           for i in range(0, len(attn), args.micro))
    real = int(attn.sum())
    times = {False: [], True: []}
    for r in range(args.repeats + 1):
        for packed in (False, True):
            t = update_pass(model, ids, attn, mask, args.micro, packed)
            if r:
                times[packed].append(t)
    pad_t, pack_t = statistics.median(times[False]), statistics.median(times[True])
    params = sum(x.numel() for x in model.parameters())
    print(f"model: {params / 1e6:.2f}M parameters; rollout: {len(ids)} sequences, {real} tokens "
          f"({int(mask.sum())} response), micro-batches of {args.micro}")
    print("| forward | positions computed | padding share | update pass (median s) |\n|---|---|---|---|")
    print(f"| padded | {padded_positions} | {1 - real / padded_positions:.3f} | {pad_t:.3f} |")
    print(f"| packed | {real} | 0 | {pack_t:.3f} |")
    print(f"speed-up of the update pass: {pad_t / pack_t:.2f}x")


if __name__ == "__main__":
    main(sys.argv[1:])
