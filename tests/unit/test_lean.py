"""The lean sampler against Hugging Face's generate and forward, on tiny random models of every
supported architecture.

Tolerance (fp32): greedy completions identical token for token; the next-token log-probs the lean
decoder computes at every step equal a teacher-forced Hugging Face forward of the same sequences
to 1e-5; sampling draws from the same distribution (checked on one step against the exact
softmax) and honours temperature, top-k, top-p and suppressed tokens."""
from __future__ import annotations

import os

import pytest
import torch
from lean_models import MODELS, SPECIAL, TOK, build
from rlft.rollout import native
from rlft.rollout.generate import SamplingConfig, cut_at_eos, describe_sampler, generate, native_kernel, use_lean
from rlft.rollout.lean import (LeanDecoder, distinct_rows, gumbel_sample, lean_generate, native_unsupported,
                               pair_order, rotate_pairs, unsupported)

TEXTS = ["Q: 1+2?\nA:", "Q: what is 12 times 7, minus 3?\nA:", "Q: 5?\nA:", "Q: 1+2?\nA:"]


def step_kernel(which: str):
    """None for the PyTorch decoding step; the compiled CPU kernel for "native" (CI must build it:
    elsewhere a machine without a C++ compiler skips these cases)."""
    if which == "torch":
        return None
    reason = native.unavailable_reason()
    if reason and not os.environ.get("CI"):
        pytest.skip(f"CPU decoding kernel unavailable: {reason}")
    assert reason is None, reason
    return native.kernel()


def left_padded(texts=TEXTS):
    prompts = [TOK(t, add_special_tokens=False)["input_ids"] for t in texts]
    width = max(map(len, prompts))
    ids = torch.tensor([[TOK.pad_token_id] * (width - len(p)) + p for p in prompts])
    return prompts, ids, (ids != TOK.pad_token_id).long()


@pytest.mark.parametrize("kernel", ["torch", "native"])
@pytest.mark.parametrize("name", sorted(MODELS))
def test_greedy_completions_equal_hugging_face_generate(name, kernel):
    model = build(name)
    _, ids, attn = left_padded()
    ref = model.generate(input_ids=ids, attention_mask=attn, max_new_tokens=20, do_sample=False,
                         pad_token_id=TOK.pad_token_id, eos_token_id=TOK.eos_token_id)[:, ids.shape[1]:]
    lean = lean_generate(model, ids, attn, 20, False, 1.0, 0, 1.0, TOK.eos_token_id, TOK.pad_token_id,
                         native=step_kernel(kernel))
    assert torch.equal(lean, ref)


@pytest.mark.parametrize("kernel", ["torch", "native"])
@pytest.mark.parametrize("name", sorted(MODELS))
def test_every_step_log_probs_equal_a_teacher_forced_forward(name, kernel):
    """Feed a fixed continuation through the lean decoder step by step and compare each step's
    log-softmax with one Hugging Face forward over the whole (left-padded) sequences."""
    model = build(name)
    _, ids, attn = left_padded()
    cont = torch.randint(3, len(TOK), (ids.shape[0], 12), generator=torch.Generator().manual_seed(1))
    full, full_attn = torch.cat([ids, cont], 1), torch.cat([attn, torch.ones_like(cont)], 1)
    with torch.no_grad():
        ref = model(input_ids=full, attention_mask=full_attn).logits.float().log_softmax(-1)
        ref = ref[:, ids.shape[1] - 1:-1]  # predictions of cont[0] .. cont[-1]
    B, P = ids.shape
    decoder = LeanDecoder(model, B, P + cont.shape[1], ids.device, native=step_kernel(kernel))
    uniq, uattn, rows = distinct_rows(ids, attn)
    assert len(uniq) == 3  # the repeated prompt is prefilled once
    steps = [decoder.prefill(uniq, uattn, rows)]
    key_mask = torch.cat([attn.bool(), torch.ones(B, cont.shape[1], dtype=torch.bool)], 1)
    for s in range(cont.shape[1] - 1):
        with torch.no_grad():
            steps.append(decoder.step(cont[:, s], attn.sum(-1) + s, key_mask))
    got = torch.stack(steps, 1).log_softmax(-1)
    valid = torch.isfinite(ref)
    torch.testing.assert_close(got[valid], ref[valid], atol=1e-5, rtol=0)


@pytest.mark.parametrize("name", ["llama", "qwen2", "qwen3"])
def test_bf16_models_match_hugging_face_to_bf16_rounding(name):
    """In bf16 the two compute the same operations in another order: next-token log-probs agree to
    2e-2 (measured: at most 5e-3) along the lean sampler's own greedy completion."""
    model = build(name).to(torch.bfloat16)
    _, ids, attn = left_padded()
    new = lean_generate(model, ids, attn, 16, False, 1.0, 0, 1.0, TOK.eos_token_id, TOK.pad_token_id)
    full, full_attn = torch.cat([ids, new], 1), torch.cat([attn, torch.ones_like(new)], 1)
    with torch.no_grad():
        ref = model(input_ids=full, attention_mask=full_attn).logits.float().log_softmax(-1)[:, ids.shape[1] - 1:-1]
        uniq, uattn, rows = distinct_rows(ids, attn)
        decoder = LeanDecoder(model, ids.shape[0], full.shape[1], ids.device)
        steps = [decoder.prefill(uniq, uattn, rows)]
        key_mask = torch.cat([attn.bool(), torch.ones(new.shape, dtype=torch.bool)], 1)
        for s in range(new.shape[1] - 1):
            steps.append(decoder.step(new[:, s], attn.sum(-1) + s, key_mask))
    got = torch.stack(steps, 1).log_softmax(-1)
    torch.testing.assert_close(got, ref, atol=2e-2, rtol=0)


@pytest.mark.parametrize("name", ["llama-gqa-untied", "qwen3"])
def test_fixed_shape_step_equals_the_teacher_forced_forward(name):
    """The CUDA-graph step (fixed shapes: every cache column, masked; the column to fill a device
    tensor) run eagerly gives the same next-token log-probs as the forward, to 1e-5."""
    model = build(name)
    _, ids, attn = left_padded()
    cont = torch.randint(3, len(TOK), (ids.shape[0], 10), generator=torch.Generator().manual_seed(2))
    full, full_attn = torch.cat([ids, cont], 1), torch.cat([attn, torch.ones_like(cont)], 1)
    with torch.no_grad():
        ref = model(input_ids=full, attention_mask=full_attn).logits.float().log_softmax(-1)[:, ids.shape[1] - 1:-1]
        B, P = ids.shape
        decoder = LeanDecoder(model, B, P + cont.shape[1], ids.device)
        steps = [decoder.prefill(*distinct_rows(ids, attn))]
        visible = torch.zeros(B, P + cont.shape[1], dtype=torch.bool)
        visible[:, :P] = attn.bool()
        column = torch.zeros(1, dtype=torch.long)
        for s in range(cont.shape[1] - 1):
            column.fill_(P + s)
            steps.append(decoder.fixed_step(cont[:, s], attn.sum(-1) + s, column, visible))
    torch.testing.assert_close(torch.stack(steps, 1).log_softmax(-1), ref, atol=1e-5, rtol=0)
    assert torch.equal(visible[:, :P], attn.bool()) and visible[:, P:-1].all() and not visible[:, -1].any()


def test_rotary_embedding_in_pair_order_equals_hugging_faces_and_keeps_dot_products():
    """Rows of a projection in pair order, rotated by one complex multiplication, give Hugging
    Face's rotated queries in pair order, so every query-key dot product is unchanged."""
    from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

    model = build("llama-gqa-untied")
    heads, D = 4, 16
    g = torch.Generator().manual_seed(3)
    x = torch.randn(2, 5, 64, generator=g)  # hidden states [b, T, hidden]
    w = model.model.layers[0].self_attn.q_proj.weight  # [heads * D, hidden]
    cos, sin = model.model.rotary_emb(x, torch.arange(5)[None])
    ref, _ = apply_rotary_pos_emb((x @ w.T).view(2, 5, heads, D).transpose(1, 2), torch.zeros(2, heads, 5, D),
                                  cos, sin)
    freqs = torch.complex(cos[0, :, :D // 2], sin[0, :, :D // 2])  # [T, D/2]
    got = rotate_pairs((x @ pair_order(w, heads).T).view(2, 5, heads, D).transpose(1, 2), freqs)
    in_pairs = ref.reshape(2, heads, 5, 2, D // 2).transpose(-1, -2).reshape(ref.shape)  # (0, D/2, 1, D/2+1, ...)
    torch.testing.assert_close(got, in_pairs, atol=1e-6, rtol=0)
    torch.testing.assert_close(got @ got.mT, ref @ ref.mT, atol=1e-5, rtol=1e-5)
    assert torch.equal(pair_order(torch.arange(8.0), 1), torch.tensor([0.0, 4, 1, 5, 2, 6, 3, 7]))


def test_gumbel_sampling_draws_from_the_softmax():
    logits = torch.tensor([[2.0, 0.0, -1.0, -float("inf")]]).expand(200_000, 4)
    torch.manual_seed(0)
    counts = torch.bincount(gumbel_sample(logits), minlength=4).double() / 200_000
    torch.testing.assert_close(counts, torch.softmax(logits[0].double(), -1), atol=4e-3, rtol=0)
    assert counts[3] == 0


def test_sampling_honours_top_k_top_p_temperature_and_suppressed_tokens():
    model = build("llama")
    _, ids, attn = left_padded()
    model.generation_config.suppress_tokens = [TOK.eos_token_id]
    torch.manual_seed(0)
    out = lean_generate(model, ids, attn, 40, True, 0.7, 1, 1.0, TOK.eos_token_id, TOK.pad_token_id)
    greedy = lean_generate(model, ids, attn, 40, False, 1.0, 0, 1.0, TOK.eos_token_id, TOK.pad_token_id)
    assert out.shape == (4, 40) and torch.equal(out, greedy)  # top-k 1 is greedy, EOS never drawn
    narrow = lean_generate(model, ids, attn, 40, True, 1.0, 0, 1e-6, TOK.eos_token_id, TOK.pad_token_id)
    assert torch.equal(narrow, greedy)  # top-p -> the single most likely token
    wide = lean_generate(model, ids, attn, 40, True, 5.0, 0, 1.0, TOK.eos_token_id, TOK.pad_token_id)
    assert not torch.equal(wide, greedy) and not (wide == TOK.eos_token_id).any()


def test_no_new_tokens_is_an_empty_completion():
    model = build("llama")
    _, ids, attn = left_padded()
    out = lean_generate(model, ids, attn, 0, True, 1.0, 0, 1.0, TOK.eos_token_id, TOK.pad_token_id)
    assert out.shape == (4, 0) and out.dtype == torch.long


def test_rows_stop_at_eos_and_the_batch_stops_when_all_have():
    model = build("llama")
    _, ids, attn = left_padded()
    with torch.no_grad():  # make EOS by far the likeliest token everywhere
        model.lm_head.weight[TOK.eos_token_id] = 0
        model.lm_head.bias = torch.nn.Parameter(torch.zeros(len(TOK)))
        model.lm_head.bias[TOK.eos_token_id] = 50.0
    out = lean_generate(model, ids, attn, 30, True, 1.0, 0, 1.0, TOK.eos_token_id, TOK.pad_token_id)
    assert out.tolist() == [[TOK.eos_token_id]] * 4


def test_checking_for_the_end_every_few_steps_gives_the_same_output():
    """A GPU reads back whether every row has ended only every few steps; the steps run past the
    end are trimmed, so rows ending at different steps give exactly the every-step output."""
    model = build("llama")
    _, ids, attn = left_padded()
    with torch.no_grad():  # EOS likely enough that rows end at different steps, well before 60
        model.lm_head.bias = torch.nn.Parameter(torch.zeros(len(TOK)))
        model.lm_head.bias[TOK.eos_token_id] = 3.0
    outs = []
    for every in (1, 5, 16):
        torch.manual_seed(4)
        outs.append(lean_generate(model, ids, attn, 60, True, 1.0, 0, 1.0, TOK.eos_token_id, TOK.pad_token_id,
                                  check_every=every))
    lengths = [row.index(TOK.eos_token_id) + 1 for row in outs[0].tolist()]
    assert len(set(lengths)) > 1 and outs[0].shape[1] == max(lengths) < 60
    assert all(torch.equal(o, outs[0]) for o in outs[1:])


def test_generate_takes_the_lean_path_on_cpu_and_matches_the_hugging_face_path():
    model = build("qwen2")
    prompts, _, _ = left_padded()
    lean = generate(model, TOK, prompts, 3, SamplingConfig(16, False, batch_size=5, impl="lean"))
    hf = generate(model, TOK, prompts, 3, SamplingConfig(16, False, batch_size=5, impl="hf"))
    assert lean.completion_ids == hf.completion_ids and lean.truncated == hf.truncated
    assert use_lean(model, SamplingConfig(impl="auto"), torch.device("cpu"), 64)
    assert not use_lean(model, SamplingConfig(impl="auto"), torch.device("meta"), 64)
    assert not use_lean(model, SamplingConfig(impl="hf"), torch.device("cpu"), 64)


def test_both_paths_ignore_the_checkpoints_distribution_changing_extras():
    """A chat checkpoint's repetition penalty or n-gram blocking would make samples come from
    another distribution than the policy's; neither path applies them."""
    model = build("llama")
    prompts, _, _ = left_padded()
    plain = generate(model, TOK, prompts, 1, SamplingConfig(30, False, batch_size=4, impl="hf"))
    model.generation_config.repetition_penalty = 5.0
    model.generation_config.no_repeat_ngram_size = 2
    for impl in ("hf", "lean"):
        got = generate(model, TOK, prompts, 1, SamplingConfig(30, False, batch_size=4, impl=impl))
        assert got.completion_ids == plain.completion_ids
    first = torch.tensor([prompts[0]])
    penalised = model.generate(input_ids=first, attention_mask=torch.ones_like(first), max_new_tokens=30,
                               do_sample=False, pad_token_id=TOK.pad_token_id, eos_token_id=TOK.eos_token_id)
    new = cut_at_eos(penalised[0, first.shape[1]:].tolist(), TOK.eos_token_id, TOK.pad_token_id)[0]
    assert new != plain.completion_ids[0]  # left on, the extras do change Hugging Face's output


def test_unsupported_models_fall_back_or_fail_with_the_reason():
    from transformers import GPT2Config, GPT2LMHeadModel

    gpt2 = GPT2LMHeadModel(GPT2Config(vocab_size=len(TOK), n_embd=32, n_layer=1, n_head=2, **SPECIAL))
    assert "architecture 'gpt2'" in unsupported(gpt2)
    assert not use_lean(gpt2, SamplingConfig(impl="auto"), torch.device("cpu"), 64)
    with pytest.raises(ValueError, match="engine.generation_impl=hf"):
        use_lean(gpt2, SamplingConfig(impl="lean"), torch.device("cpu"), 64)
    mistral = build("mistral")
    assert unsupported(mistral, 100) is None and "sliding-window" in unsupported(mistral, 5000)
    llama = build("llama")
    llama.model.layers[0].mlp.up_proj = torch.nn.Sequential(llama.model.layers[0].mlp.up_proj)
    assert "Sequential" in unsupported(llama)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device (run by scripts/bench_gpu.sh)")
@pytest.mark.parametrize("name", ["llama", "qwen2"])
def test_cuda_graph_decoding_equals_eager_decoding(name):
    model = build(name).cuda()
    _, ids, attn = left_padded()
    ids, attn = ids.cuda(), attn.cuda()
    args = (model, ids, attn, 24, False, 1.0, 0, 1.0, TOK.eos_token_id, TOK.pad_token_id)
    assert torch.equal(lean_generate(*args, cuda_graph=True), lean_generate(*args, cuda_graph=False))
    ref = model.generate(input_ids=ids, attention_mask=attn, max_new_tokens=24, do_sample=False,
                         pad_token_id=TOK.pad_token_id, eos_token_id=TOK.eos_token_id)[:, ids.shape[1]:]
    assert torch.equal(lean_generate(*args, cuda_graph=True), ref)


def test_the_sampler_in_use_is_described_with_its_reason():
    from transformers import GPT2Config, GPT2LMHeadModel

    cpu = torch.device("cpu")
    assert describe_sampler(build("llama"), SamplingConfig(), cpu).startswith("lean")
    if native.unavailable_reason() is None:
        assert describe_sampler(build("llama"), SamplingConfig(), cpu) == "lean (rlft's decoding loop, compiled CPU kernel)"
    assert describe_sampler(build("llama"), SamplingConfig(kernel="torch"), cpu) == \
        "lean (rlft's decoding loop, PyTorch step; engine.generation_kernel=torch)"
    assert "engine.generation_impl=hf" in describe_sampler(build("llama"), SamplingConfig(impl="hf"), cpu)
    gpt2 = GPT2LMHeadModel(GPT2Config(vocab_size=len(TOK), n_embd=32, n_layer=1, n_head=2, **SPECIAL))
    assert "lean unsupported: architecture 'gpt2'" in describe_sampler(gpt2, SamplingConfig(), cpu)


def test_native_kernel_samples_what_the_pytorch_step_samples():
    """Same seed, same Gumbel noise, logits equal to ~1e-6: the same completions, EOS and padding
    included (rows end at different steps)."""
    kernel = step_kernel("native")
    model = build("qwen2")  # biases on q/k/v, grouped-query attention
    _, ids, attn = left_padded()
    with torch.no_grad():  # EOS likely enough that rows end at different steps (the head has a bias)
        model.lm_head.bias = torch.nn.Parameter(torch.zeros(len(TOK)))
        model.lm_head.bias[TOK.eos_token_id] = 3.0
    outs = []
    for k in (None, kernel):
        torch.manual_seed(3)
        outs.append(lean_generate(model, ids, attn, 60, True, 0.8, 0, 1.0, TOK.eos_token_id, TOK.pad_token_id,
                                  native=k))
    assert torch.equal(outs[0], outs[1])
    lengths = [row.index(TOK.eos_token_id) + 1 for row in outs[0].tolist()]
    assert len(set(lengths)) > 1


def test_native_kernel_applies_only_where_it_can_and_says_why_not():
    cpu = torch.device("cpu")
    model = build("llama")
    assert native_unsupported(model, cpu) is None
    assert "CPU-only" in native_unsupported(model, torch.device("cuda"))
    assert "bfloat16" in native_unsupported(build("llama").to(torch.bfloat16), cpu)
    model.model.norm.variance_epsilon = 1e-3
    assert "epsilons" in native_unsupported(model, cpu)
    assert native_kernel(model, SamplingConfig(kernel="auto"), cpu) is None
    with pytest.raises(ValueError, match="engine.generation_kernel=torch"):
        native_kernel(model, SamplingConfig(kernel="native"), cpu)
    assert native_kernel(build("llama"), SamplingConfig(kernel="torch"), cpu) is None


def test_a_kernel_that_cannot_be_built_leaves_the_pytorch_step(monkeypatch):
    monkeypatch.setattr(native, "_loaded", {"error": "CalledProcessError: g++: command not found"})
    cpu = torch.device("cpu")
    model = build("llama")
    assert native_kernel(model, SamplingConfig(), cpu) is None
    described = describe_sampler(model, SamplingConfig(), cpu)
    assert described.endswith("PyTorch step; kernel unavailable: CalledProcessError: g++: command not found)")
    with pytest.raises(ValueError, match="g\\+\\+: command not found"):
        native_kernel(model, SamplingConfig(kernel="native"), cpu)
    prompts, _, _ = left_padded()
    got = generate(model, TOK, prompts, 1, SamplingConfig(12, False, batch_size=4))
    ref = generate(model, TOK, prompts, 1, SamplingConfig(12, False, batch_size=4, impl="hf"))
    assert got.completion_ids == ref.completion_ids


def test_the_kernel_is_cached_per_source_flags_and_cpu(monkeypatch, tmp_path):
    monkeypatch.setenv("RLFT_KERNEL_CACHE", str(tmp_path))
    first = native.cache_dir()
    assert first.parent == tmp_path and first.name.startswith("rlft_decode_cpu-")
    monkeypatch.setattr(native, "cpu_signature", lambda: "another machine")
    assert native.cache_dir() != first


@pytest.mark.parametrize("name", ["llama-gqa-untied", "qwen3"])
def test_native_kernel_on_unpadded_grouped_prompts_equals_hugging_face(name):
    """GRPO's layout: G consecutive rows per prompt, all prompts the same length (no padding, so no
    prompt mask); each prompt's keys and values are cached once for its rows. 37 new tokens: the
    rows' own key columns end inside a block of 16."""
    kernel = step_kernel("native")
    model = build(name)
    prompts = torch.randint(3, len(TOK), (3, 9), generator=torch.Generator().manual_seed(5))
    ids = prompts.repeat_interleave(4, 0)
    attn = torch.ones_like(ids)
    ref = model.generate(input_ids=ids, attention_mask=attn, max_new_tokens=37, do_sample=False,
                         pad_token_id=TOK.pad_token_id, eos_token_id=TOK.eos_token_id)[:, ids.shape[1]:]
    got = lean_generate(model, ids, attn, 37, False, 1.0, 0, 1.0, TOK.eos_token_id, TOK.pad_token_id, native=kernel)
    assert torch.equal(got, ref)
