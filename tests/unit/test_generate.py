"""Fast generation paths (static KV cache, prompt bucketing, padding to a multiple) against the
plain path (dynamic cache, rows in order, no extra padding) on a tiny random Llama.

Tolerance: greedy completions identical token for token; the per-step log-probs of the tokens
the decoder produced agree to 1e-5 (fp32)."""
from __future__ import annotations

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from rlft.data.tokenizer import build_char_tokenizer
from rlft.rollout.generate import SamplingConfig, generate, generation_order, left_pad_to_multiple
from rlft.rollout.logprobs import batched_token_logp
from rlft.rollout import batch as rb

PLAIN = dict(cache="dynamic", bucket=False, pad_multiple=1)
FAST = dict(cache="static", bucket=True, pad_multiple=16)


@pytest.fixture(scope="module")
def setup():
    tok = build_char_tokenizer()
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=len(tok), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=256,
                      pad_token_id=tok.pad_token_id, eos_token_id=tok.eos_token_id, bos_token_id=tok.bos_token_id)
    model = LlamaForCausalLM(cfg).eval()
    texts = ["Q: 1+2?\nA:", "Q: what is 12 times 7, minus 3?\nA:", "Q: 5?\nA:", "Q: 40-1-2-3 and then 8 more?\nA:"]
    prompts = [tok(t, add_special_tokens=False)["input_ids"] for t in texts]
    return tok, model, prompts


def test_generation_order_and_padding_helpers():
    assert generation_order([5, 2, 9, 2], bucket=True) == [1, 3, 0, 2]
    assert generation_order([5, 2, 9, 2], bucket=False) == [0, 1, 2, 3]
    ids, attn = torch.tensor([[0, 7, 8], [5, 6, 7]]), torch.tensor([[0, 1, 1], [1, 1, 1]])
    pids, pattn = left_pad_to_multiple(ids, attn, 0, 8)
    assert pids.shape == (2, 8) and pids[:, 5:].tolist() == ids.tolist() and pattn[:, :5].sum() == 0
    assert left_pad_to_multiple(ids, attn, 0, 1)[0] is ids


def test_fast_greedy_completions_equal_the_plain_path_in_the_callers_order(setup):
    tok, model, prompts = setup
    plain = generate(model, tok, prompts, 2, SamplingConfig(24, False, batch_size=3, **PLAIN))
    fast = generate(model, tok, prompts, 2, SamplingConfig(24, False, batch_size=3, **FAST))
    assert fast.prompt_index == plain.prompt_index == [0, 0, 1, 1, 2, 2, 3, 3]
    assert fast.completion_ids == plain.completion_ids
    assert fast.truncated == plain.truncated


def test_static_cache_decoding_gives_the_same_log_probs_as_the_dynamic_cache(setup):
    """The log-probs the decoder assigned to the tokens it emitted (scores of a greedy run) match,
    and both match a teacher-forced forward of the finished sequences (the learner's view)."""
    tok, model, prompts = setup
    ids, attn = torch.nn.utils.rnn.pad_sequence([torch.tensor(p[::-1]) for p in prompts], batch_first=True,
                                                padding_value=tok.pad_token_id).flip(1), None
    attn = (ids != tok.pad_token_id).long()
    runs = {}
    for cache in ("dynamic", "static"):
        kw = dict(max_new_tokens=16, do_sample=False, pad_token_id=tok.pad_token_id, eos_token_id=tok.eos_token_id,
                  output_logits=True, return_dict_in_generate=True, suppress_tokens=[tok.eos_token_id])
        if cache == "static":
            kw.update(cache_implementation="static", disable_compile=True)
        out = model.generate(input_ids=ids, attention_mask=attn, **kw)
        new = out.sequences[:, ids.shape[1]:]
        logp = torch.stack([torch.log_softmax(s.float(), -1) for s in out.logits], 1).gather(-1, new[..., None])
        runs[cache] = (new, logp.squeeze(-1))
    assert torch.equal(runs["dynamic"][0], runs["static"][0])
    torch.testing.assert_close(runs["static"][1], runs["dynamic"][1], atol=1e-5, rtol=0)
    seqs, sattn, mask = rb.build_sequences([p for p in prompts], runs["static"][0].tolist(), tok.pad_token_id)
    forced = batched_token_logp(model, seqs, sattn, 4)
    got = [forced[i][mask[i].bool()] for i in range(len(prompts))]
    torch.testing.assert_close(torch.stack(got), runs["static"][1], atol=1e-5, rtol=0)


def test_sampling_keeps_the_callers_order_and_the_static_cache_draws_what_the_dynamic_one_does(setup):
    """With bucketing the rows are regrouped (so the random draws land on other rows) but come back
    in the caller's order; without it, the static and dynamic caches draw identical samples from
    the same seed."""
    tok, model, prompts = setup
    torch.manual_seed(1)
    fast = generate(model, tok, prompts, 4, SamplingConfig(12, True, batch_size=8, **FAST))
    assert fast.prompt_index == [i for i in range(4) for _ in range(4)]
    assert all(len(c) <= 12 for c in fast.completion_ids)
    torch.manual_seed(1)
    unbucketed = generate(model, tok, prompts, 4, SamplingConfig(12, True, batch_size=8, cache="static",
                                                                 bucket=False, pad_multiple=1))
    torch.manual_seed(1)
    plain = generate(model, tok, prompts, 4, SamplingConfig(12, True, batch_size=8, **PLAIN))
    assert unbucketed.completion_ids == plain.completion_ids  # same rows, same seed: the same draws
