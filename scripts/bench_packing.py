#!/usr/bin/env python3
"""Padded against packed (train.packing) RL update forwards on a real rollout's token lengths.

    python scripts/bench_packing.py --samples runs/rl_table/eval/sft/samples.jsonl --model runs/rl_table/sft/final
    python scripts/bench_packing.py ... --width 512 --layers 8     # a wider random model, same lengths
    python scripts/bench_packing.py ... --max-tokens 2048          # also forwards cut by a token budget

The workload is GRPO's update on the built-in task: --prompts prompts x their sampled completions
(an `rlft eval` samples.jsonl: its prompts rendered with the chat template of the model's tokenizer,
its completions tokenized), right-padded as a rollout, in micro-batches of --micro sequences. Each
repetition times one update pass (forward, the policy-gradient loss on response tokens, backward) padded
and then packed, on one CPU thread; prints the padding share of the padded micro-batches, the tokens
each computes, the median seconds of each and the speed-up. With --max-tokens the same passes also run
with forwards formed by that token budget (train.max_tokens_per_micro_batch: longest first, so
sequences of like length share a padded forward).
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


def update_pass(model, ids, attn, mask, groups: list[list[int]], packed: bool) -> float:
    """Seconds for forward + loss + backward over every micro-batch (rows `groups`; gradients discarded)."""
    from rlft.rollout.logprobs import forward_logits, packed_logp, response_start, selective_logp

    tic = time.perf_counter()
    for group in groups:
        rows = torch.tensor(group)
        width = int(attn[rows].sum(-1).max())
        b_ids, b_attn, b_mask = ids[rows, :width], attn[rows, :width], mask[rows, :width - 1]
        if packed:
            logp = packed_logp(model, b_ids, b_attn, b_mask)
        else:
            start = response_start(b_mask)
            logp = selective_logp(forward_logits(model, b_ids, b_attn, start), b_ids[:, start + 1:])
            b_mask = b_mask[:, start:]
        (-(logp * b_mask).sum() / b_mask.sum()).backward()
    model.zero_grad(set_to_none=True)
    return time.perf_counter() - tic


def positions(attn, groups: list[list[int]]) -> int:
    """Positions the padded forwards compute: each group's rows x its longest."""
    return sum(len(g) * int(attn[torch.tensor(g)].sum(-1).max()) for g in groups)


def main(argv: list[str]) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--samples", required=True, help="an rlft eval samples.jsonl (prompts and sampled completions)")
    p.add_argument("--model", required=True, help="a Hugging Face model directory (its tokenizer is used)")
    p.add_argument("--prompts", type=int, default=32, help="prompts of the rollout (x their samples)")
    p.add_argument("--micro", type=int, default=64, help="sequences per micro-batch")
    p.add_argument("--repeats", type=int, default=7, help="timed repetitions (after one warm-up)")
    p.add_argument("--width", type=int, default=0, help="a random model of this hidden size instead (0: the model)")
    p.add_argument("--layers", type=int, default=8, help="layers of the random model")
    p.add_argument("--max-tokens", type=int, default=0, help="also time forwards cut by this token budget")
    args = p.parse_args(argv)
    from rlft import microbatch

    torch.set_num_threads(1)
    tok, model = load(args)
    ids, attn, mask = rollout(tok, args)
    lengths = [[int(n)] for n in attn.sum(-1)]
    real = int(attn.sum())
    # name -> (row groups, packed)
    setups = {"padded": (microbatch.fixed(len(ids), args.micro), False),
              "packed": (microbatch.fixed(len(ids), args.micro), True)}
    if args.max_tokens:
        setups["padded, token budget"] = (microbatch.by_tokens(lengths, args.max_tokens, packed=False), False)
        setups["packed, token budget"] = (microbatch.by_tokens(lengths, args.max_tokens, packed=True), True)
    times = {name: [] for name in setups}
    for r in range(args.repeats + 1):
        for name, (groups, packed) in setups.items():
            t = update_pass(model, ids, attn, mask, groups, packed)
            if r:
                times[name].append(t)
    base = statistics.median(times["padded"])
    params = sum(x.numel() for x in model.parameters())
    print(f"model: {params / 1e6:.2f}M parameters; rollout: {len(ids)} sequences, {real} tokens "
          f"({int(mask.sum())} response); fixed micro-batches of {args.micro} sequences"
          + (f", token budget {args.max_tokens}" if args.max_tokens else ""))
    print("| forwards | micro-batches | positions computed | padding share | update pass (median s) | speed-up |")
    print("|---|---|---|---|---|---|")
    for name, (groups, packed) in setups.items():
        computed = real if packed else positions(attn, groups)
        median = statistics.median(times[name])
        print(f"| {name} | {len(groups)} | {computed} | {1 - real / computed:.3f} | {median:.3f} | {base / median:.2f}x |")


if __name__ == "__main__":
    main(sys.argv[1:])
