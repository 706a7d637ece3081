"""A group's prompt run once (train.share_prompt in the trainer's forwards, rollout.hf_share_prefill in the hf
engine's prefill): the same logits, log-probs, gradients and generations as running every whole sequence, on a
model with tied embeddings and one without, with prompts of different lengths and groups split across
forwards."""
from __future__ import annotations

import warnings

import pytest
import torch

from rlft.rollout import batch as rb
from rlft.rollout.generate import shared_prefill
from rlft.rollout.lm_head import cache_kwargs
from rlft.rollout.logprobs import forward_logits, prompt_runs, response_start, selective_logp, shared_prompt_logits


def tiny(kind: str):
    from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(0)
    common = dict(vocab_size=120, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                  num_key_value_heads=2, max_position_embeddings=128)
    if kind == "llama":  # untied output layer
        return LlamaForCausalLM(LlamaConfig(**common, tie_word_embeddings=False)).eval()
    return Qwen2ForCausalLM(Qwen2Config(**common, tie_word_embeddings=True)).eval()


def group_batch():
    """Three prompts of different lengths, three completions each (different lengths, some ending in EOS 2);
    the last group is cut after its first completion, as a forward boundary may cut it."""
    prompts = [[5, 6, 7, 8, 9, 10, 11], [20, 21, 22], [30, 31, 32, 33, 34]]
    pids, cids = [], []
    for p in prompts:
        for g in range(3):
            pids.append(p)
            cids.append([40 + g, 41, 42 + g, 2][:2 + g])
    pids, cids = pids[:7], cids[:7]
    ids, attn, mask = rb.build_sequences(pids, cids, 0)
    return ids, attn, mask, [len(p) for p in pids]


def test_prompt_runs_count_consecutive_rows_of_one_prompt():
    ids, _, _, lens = group_batch()
    assert prompt_runs(ids, lens) == [3, 3, 1]
    assert prompt_runs(ids[[0, 3, 1]], [lens[0], lens[3], lens[1]]) == [1, 1, 1]  # not consecutive: not shared


@pytest.mark.parametrize("kind", ["llama", "qwen2-tied"])
@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_shared_prompt_logits_equal_the_whole_sequence_forward(kind, temperature):
    model = tiny(kind)
    ids, attn, mask, lens = group_batch()
    start = response_start(mask)
    response = mask[:, start:].bool()
    targets = ids[:, start + 1:]

    def logp_and_grads(fn):
        model.zero_grad()
        logp = selective_logp(fn(), targets)
        (logp * response).sum().backward()
        return logp.detach(), {n: p.grad.clone() for n, p in model.named_parameters()}

    whole, g_whole = logp_and_grads(lambda: forward_logits(model, ids, attn, start, temperature))
    with warnings.catch_warnings():  # the KV cache goes by the keyword this transformers reads (no deprecation)
        warnings.simplefilter("error", FutureWarning)
        shared, g_shared = logp_and_grads(lambda: shared_prompt_logits(model, ids, attn, lens, start, temperature))
    assert (whole - shared)[response].abs().max() < 1e-5
    assert max((g_whole[n] - g_shared[n]).abs().max() for n in g_whole) < 1e-5
    assert all(g_shared[n].abs().sum() > 0 for n in g_shared)  # gradients reach every weight, the prompt's too


@pytest.mark.parametrize("kind", ["llama", "qwen2-tied"])
def test_a_shared_prefill_generates_what_a_full_prefill_does(kind):
    model = tiny(kind)
    rows = [[5, 6, 7, 8], [5, 6, 7, 8], [9, 10], [9, 10], [9, 10], [11, 12, 13]]  # left-padded below
    width = max(map(len, rows))
    ids = torch.tensor([[0] * (width - len(r)) + r for r in rows])
    attn = (ids != 0).long()
    kwargs = dict(max_new_tokens=6, do_sample=False, pad_token_id=0, eos_token_id=None)
    with torch.no_grad():
        full = model.generate(input_ids=ids, attention_mask=attn, **kwargs)
        with warnings.catch_warnings():  # the cache's keyword is the one this transformers reads (no deprecation)
            warnings.simplefilter("error", FutureWarning)
            cache = shared_prefill(model, ids, attn)
            assert cache.get_seq_length() == width - 1 and cache.layers[0].keys.shape[0] == len(rows)
            shared = model.generate(input_ids=ids, attention_mask=attn, **cache_kwargs(model, cache), **kwargs)
        assert shared_prefill(model, ids[[0, 2, 5]], attn[[0, 2, 5]]) is None  # nothing to share
    assert torch.equal(full, shared)
