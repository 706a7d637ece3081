"""The hf rollout engine (transformers generate) on a tiny random Llama: fast paths against the
plain path, the caller's row order, and the sampler's own log-probs against the trainer's forward.

Tolerance: greedy completions identical token for token; log-probs agree to 1e-5 (fp32)."""
from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from rlft.data.tokenizer import build_char_tokenizer
from rlft.rollout import batch as rb
from rlft.rollout.generate import (Frozen, HFEngine, Sampling, choose_engine, generation_order,
                                   left_pad_to_multiple)
from rlft.rollout.logprobs import batched_token_logp

PLAIN = dict(hf_cache="dynamic", hf_bucket=False, hf_pad_multiple=1, hf_compile=False, hf_share_prefill=False)
FAST = dict(hf_cache="static", hf_bucket=True, hf_pad_multiple=16, hf_compile=True, hf_share_prefill=False)
SHARED = dict(hf_cache="dynamic", hf_bucket=True, hf_pad_multiple=16, hf_compile=False, hf_share_prefill=True)


def engine(model, tok, batch_size: int, **speed) -> HFEngine:
    return HFEngine(Frozen(model), tok, torch.device("cpu"), SimpleNamespace(batch_size=batch_size, **speed))


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


@pytest.mark.parametrize("speed", [FAST, SHARED], ids=["static", "shared-prefill"])
def test_fast_greedy_completions_equal_the_plain_path_in_the_callers_order(setup, speed):
    tok, model, prompts = setup
    plain = engine(model, tok, 3, **PLAIN).generate(prompts, 2, Sampling(24, False))
    fast = engine(model, tok, 3, **speed).generate(prompts, 2, Sampling(24, False))
    assert fast.prompt_index == plain.prompt_index == [0, 0, 1, 1, 2, 2, 3, 3]
    assert fast.completion_ids == plain.completion_ids
    assert fast.truncated == plain.truncated
    torch.testing.assert_close(torch.tensor(fast.logp), torch.tensor(plain.logp), atol=1e-5, rtol=0)


@pytest.mark.parametrize("sampling", [Sampling(16, False), Sampling(16, True, 0.7, 0.9, 20), Sampling(16, True)])
def test_sampler_log_probs_are_the_processed_distributions_and_match_the_trainers_forward(setup, sampling):
    """The engine's log-prob of each emitted token is that of the distribution it sampled from
    (temperature, then top-k / top-p renormalised); at top-k = 0 and top-p = 1 it equals a
    teacher-forced forward of the finished sequences at the same temperature (the trainer's view)."""
    tok, model, prompts = setup
    torch.manual_seed(3)
    gens = engine(model, tok, 8, **FAST).generate(prompts, 2, sampling)
    assert [len(lp) for lp in gens.logp] == [len(c) for c in gens.completion_ids]
    seqs, attn, mask = rb.build_sequences([prompts[i] for i in gens.prompt_index], gens.completion_ids,
                                          tok.pad_token_id)
    temperature = sampling.temperature if sampling.do_sample else 1.0
    forced = batched_token_logp(model, seqs, attn, 8, temperature)
    engine_logp = rb.target_aligned(gens.logp, [len(prompts[i]) for i in gens.prompt_index], mask.shape[1])
    if sampling.top_k == 0 and sampling.top_p == 1.0:
        torch.testing.assert_close(engine_logp * mask, forced * mask, atol=1e-5, rtol=0)
    else:  # truncation renormalises: every sampled token's probability can only grow
        assert bool(((engine_logp - forced) * mask >= -1e-5).all())
        assert float(((engine_logp - forced) * mask).sum()) > 0


def test_sampling_keeps_the_callers_order_and_the_static_cache_draws_what_the_dynamic_one_does(setup):
    """With bucketing the rows are regrouped (so the random draws land on other rows) but come back
    in the caller's order; without it, the static and dynamic caches draw identical samples from
    the same seed."""
    tok, model, prompts = setup
    torch.manual_seed(1)
    fast = engine(model, tok, 8, **FAST).generate(prompts, 4, Sampling(12, True))
    assert fast.prompt_index == [i for i in range(4) for _ in range(4)]
    assert all(len(c) <= 12 for c in fast.completion_ids)
    torch.manual_seed(1)
    unbucketed = engine(model, tok, 8, **dict(FAST, hf_bucket=False, hf_pad_multiple=1)).generate(
        prompts, 4, Sampling(12, True))
    torch.manual_seed(1)
    plain = engine(model, tok, 8, **PLAIN).generate(prompts, 4, Sampling(12, True))
    assert unbucketed.completion_ids == plain.completion_ids  # same rows, same seed: the same draws


def test_target_aligned_places_each_completion_token_after_its_prompt():
    out = rb.target_aligned([[-1.0, -2.0], [-3.0]], [3, 1], 5)
    assert out.tolist() == [[0, 0, -1, -2, 0], [-3, 0, 0, 0, 0]]


def test_engine_choice():
    cpu, gpu = torch.device("cpu"), torch.device("cuda", 0)
    assert choose_engine("hf", gpu)[0] == "hf"
    assert choose_engine("auto", cpu)[0] == "hf"
    with pytest.raises(ValueError, match="rollout.engine='x' is not valid; choose one of: auto, hf, vllm"):
        choose_engine("x", cpu)
    assert choose_engine("auto", cpu)[1] == ("auto: CPU (vLLM's CPU decoding is slower than transformers' for "
                                             "small models)")


def test_an_engine_is_one_registry_entry(monkeypatch):
    """choose_engine names no engine: a registered one that prefers GPUs and runs here is auto's choice there, one
    that cannot run is refused by name with how to install it."""
    from rlft.rollout import generate, sampling

    gpu = torch.device("cuda", 0)
    fake = generate.EngineSpec(lambda *a: None, lambda: None, auto_on=("cuda",))
    monkeypatch.setattr(generate, "ENGINE_SPECS", {"hf": generate.ENGINE_SPECS["hf"], "fast": fake})
    monkeypatch.setattr(generate, "ENGINES", ("auto", "hf", "fast"))
    assert choose_engine("auto", gpu) == ("fast", "auto: GPU with fast installed")
    broken = generate.EngineSpec(lambda *a: None, lambda: "fast is not importable", install="pip install fast")
    monkeypatch.setitem(generate.ENGINE_SPECS, "fast", broken)
    with pytest.raises(RuntimeError, match=r"rollout.engine=fast but fast is not importable; install it \(pip inst"):
        choose_engine("fast", gpu)
    assert sampling.ENGINES == ("auto", "hf", "vllm")
