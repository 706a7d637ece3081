"""The LM head a chunk of tokens at a time (train.logit_chunk_tokens, rlft/rollout/lm_head.py): log-probs,
entropies, argmax hits and gradients equal the model's own logits to 1e-5 in fp32, padded, packed and with
shared prompts, on a model with tied embeddings, one without and one that soft-caps its logits; the first
forward refuses a model whose logits are not its head of its last hidden state."""
from __future__ import annotations

import pytest
import torch
import transformers

from rlft.rollout import lm_head
from rlft.rollout.logprobs import packed_logp, token_logp

V = 97


def tiny(kind: str):
    torch.manual_seed(0)
    common = dict(vocab_size=V, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                  num_key_value_heads=2, max_position_embeddings=64)
    if kind == "llama":  # untied output layer
        return transformers.LlamaForCausalLM(transformers.LlamaConfig(**common, tie_word_embeddings=False))
    if kind == "gemma2-softcap":
        return transformers.Gemma2ForCausalLM(transformers.Gemma2Config(**common, head_dim=8, final_logit_softcapping=3.0))
    return transformers.Qwen2ForCausalLM(transformers.Qwen2Config(**common, tie_word_embeddings=True))


def batch():
    """Right-padded rows of different lengths; the response mask covers each row's targets after 3 tokens."""
    g = torch.Generator().manual_seed(1)
    lengths = [9, 5, 12, 7]
    ids = torch.zeros(len(lengths), max(lengths), dtype=torch.long)
    attn = torch.zeros_like(ids)
    for i, n in enumerate(lengths):
        ids[i, :n] = torch.randint(3, V, (n,), generator=g)
        attn[i, :n] = 1
    mask = attn[:, 1:].clone().float()
    mask[:, :2] = 0
    return ids, attn, mask


def reference(model, ids, attn, mask, temperature):
    """From the model's own logits: log-probs, entropies and argmax hits of the targets, 0 outside the mask."""
    logits = model(input_ids=ids, attention_mask=attn).logits[:, :-1].float() / temperature
    logp = torch.log_softmax(logits, -1)
    picked = logp.gather(-1, ids[:, 1:, None])[..., 0]
    ent = -(logp.exp() * logp).sum(-1)
    top1 = (logits.argmax(-1) == ids[:, 1:]).float()
    return picked * mask, ent.detach() * mask, top1 * mask


def grads_of(model, logp):
    model.zero_grad()
    logp.sum().backward()
    return {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


@pytest.mark.parametrize("kind", ["qwen2-tied", "llama", "gemma2-softcap"])
@pytest.mark.parametrize("path", ["padded", "packed", "shared_prompt"])
def test_chunked_head_equals_the_models_own_logits(kind, path, monkeypatch):
    monkeypatch.setattr(lm_head, "DEFAULT_CHUNK_TOKENS", 5)  # several chunks, the last one short
    model = tiny(kind)
    ids, attn, mask = batch()
    temperature = 0.7
    want, want_ent, want_top1 = reference(model, ids, attn, mask, temperature)
    g_want = grads_of(model, want)
    if path == "packed":
        got, extra = packed_logp(model, ids, attn, mask, temperature, ("entropy", "top1"))
    elif path == "shared_prompt":  # rows 0 and 1 share their first 3 tokens as one prompt
        ids[1, :3] = ids[0, :3]
        want, want_ent, want_top1 = reference(model, ids, attn, mask, temperature)
        g_want = grads_of(model, want)
        got, extra = token_logp(model, ids, attn, temperature, 2, [3, 3, 3, 3], mask, ("entropy", "top1"))
    else:
        got, extra = token_logp(model, ids, attn, temperature, 0, None, mask, ("entropy", "top1"))
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(extra["entropy"], want_ent, rtol=1e-5, atol=1e-5)
    assert torch.equal(extra["top1"], want_top1)
    g_got = grads_of(model, got)
    assert g_got.keys() == g_want.keys()
    for name in g_want:
        torch.testing.assert_close(g_got[name], g_want[name], rtol=1e-5, atol=1e-5, msg=name)


def test_chunk_size_zero_is_the_models_own_logits_path(monkeypatch):
    monkeypatch.setattr(lm_head, "DEFAULT_CHUNK_TOKENS", 0)
    model = tiny("llama")
    ids, attn, mask = batch()
    shapes = []
    model.lm_head.register_forward_hook(lambda _m, args, _o: shapes.append(tuple(args[0].shape[:-1])))
    got = token_logp(model, ids, attn, mask=mask)
    assert shapes == [tuple(ids.shape)]  # one head call over every position of every row
    torch.testing.assert_close(got, reference(model, ids, attn, mask, 1.0)[0], rtol=1e-5, atol=1e-5)


def test_at_most_one_chunk_of_logits_reaches_the_head_at_a_time(monkeypatch):
    monkeypatch.setattr(lm_head, "DEFAULT_CHUNK_TOKENS", 4)
    model = tiny("llama")
    ids, attn, mask = batch()
    token_logp(model, ids[:1], attn[:1], mask=mask[:1])  # the first forward's check of the head, not counted
    rows = []
    model.lm_head.register_forward_hook(lambda _m, args, _o: rows.append(args[0].shape[:-1].numel()))
    logp = token_logp(model, ids, attn, mask=mask)
    logp.sum().backward()  # the backward recomputes each chunk
    n = int(mask.sum())
    head_calls = [r for r in rows if r != 0]
    assert max(head_calls) <= 4 and sum(head_calls) == 2 * n  # forward and recompute, only at masked tokens


def test_a_model_that_changes_its_logits_another_way_is_refused():
    model = tiny("llama")
    forward = model.forward

    def scaled(*args, **kwargs):
        out = forward(*args, **kwargs)
        out.logits = out.logits * 2.0
        return out
    model.forward = scaled
    ids, attn, mask = batch()
    with pytest.raises(ValueError, match="train.logit_chunk_tokens=0"):
        token_logp(model, ids, attn, mask=mask)


def test_truncate_is_the_samplers_warpers_and_keeps_the_target():
    from transformers import TopKLogitsWarper, TopPLogitsWarper

    g = torch.Generator().manual_seed(0)
    logits = torch.randn(6, V, generator=g) * 3
    targets = logits.argsort(-1)[:, 0]  # each row's least likely token: outside any kept set
    assert torch.equal(lm_head.truncate(logits, targets), logits)  # top_k 0, top_p 1: the same tensor
    kept = TopPLogitsWarper(0.9)(None, TopKLogitsWarper(20)(None, logits))
    got = lm_head.truncate(logits, targets, 20, 0.9)
    rows = torch.arange(6)
    assert torch.isinf(kept[rows, targets]).all() and torch.equal(got[rows, targets], logits[rows, targets])
    others = torch.ones_like(logits, dtype=torch.bool)
    others[rows, targets] = False
    assert torch.equal(got[others], kept[others])
    assert (torch.isfinite(got).sum(-1) <= 21).all()


def test_hf_engine_log_probs_at_top_p_are_the_trainers_truncated_ones():
    """The hf engine samples from the truncated distribution and reports its log-probs; the trainer's full
    softmax is below them by log S, the replayed truncation equals them (the bias the update would carry)."""
    from omegaconf import OmegaConf

    from rlft.config.schema import Config
    from rlft.data.tokenizer import build_char_tokenizer
    from rlft.rollout import batch as rb
    from rlft.rollout.generate import Frozen, Sampling, build_engine
    from rlft.rollout.logprobs import batched_token_logp

    tok = build_char_tokenizer()
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(transformers.LlamaConfig(
        vocab_size=len(tok), hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
        num_key_value_heads=2, pad_token_id=tok.pad_token_id, eos_token_id=tok.eos_token_id)).eval()
    cfg = OmegaConf.structured(Config)
    cfg.rollout.engine, cfg.rollout.max_new_tokens = "hf", 24
    engine, _ = build_engine(cfg, Frozen(model), tok, torch.device("cpu"))
    prompts = [tok(t, add_special_tokens=False)["input_ids"] for t in ["Q: 1+2?\nA:", "Q: 7 times 3?\nA:"]]
    gens = engine.generate(prompts, 4, Sampling(24, True, 0.8, 0.9, 0))
    ids, attn, mask = rb.build_sequences([prompts[i] for i in gens.prompt_index], gens.completion_ids,
                                         tok.pad_token_id)
    sampled = rb.target_aligned(gens.logp, [len(prompts[i]) for i in gens.prompt_index], mask.shape[1])
    full = batched_token_logp(model, ids, attn, 8, 0.8, mask)
    replayed = batched_token_logp(model, ids, attn, 8, 0.8, mask, top_p=0.9)
    on = mask.bool()
    assert on.sum() > 40
    assert float((full - sampled)[on].mean()) < -0.05 and float((full - sampled)[on].max()) < 1e-5
    assert float((replayed - sampled)[on].abs().max()) < 1e-5
    untouched = batched_token_logp(model, ids, attn, 8, 0.8, mask, top_k=0, top_p=1.0)
    assert torch.equal(untouched, full)  # no truncation asked: bit for bit the same values


def test_the_default_chunk_holds_a_fixed_budget_of_logits_whatever_the_vocabulary():
    assert lm_head.default_chunk_tokens(49_152) == 1024  # SmolLM2: 192 MiB of fp32 logits
    assert lm_head.default_chunk_tokens(151_936) == 256  # Qwen2: 148 MiB (512 would be 297)
    for vocab in (97, 32_000, 128_256, 256_000):
        n = lm_head.default_chunk_tokens(vocab)
        assert n * vocab * 4 <= lm_head.CHUNK_LOGIT_BYTES < 2 * n * vocab * 4
    model = tiny("llama")
    assert lm_head.chunk_tokens_of(model) == lm_head.default_chunk_tokens(V)  # no train.logit_chunk_tokens of its own
    model.cfg = type("Cfg", (), {"train": type("Train", (), {"logit_chunk_tokens": 16})})()
    assert lm_head.chunk_tokens_of(model) == 16


def clipped_terms(logp, t, divergence=None):
    """A GRPO-like per-token loss: the clipped surrogate plus 0.04 x k3 to a reference, weighted per token."""
    ratio = torch.exp(logp - t["old"])
    policy = -torch.min(ratio * t["adv"], ratio.clamp(0.8, 1.2) * t["adv"])
    kl = torch.exp(t["ref"] - logp) - (t["ref"] - logp) - 1
    return (policy + 0.04 * kl) * t["weight"]


@pytest.mark.parametrize("kind", ["qwen2-tied", "llama", "gemma2-softcap", "llama-lora-head"])
@pytest.mark.parametrize("path", ["padded", "packed", "shared_prompt"])
def test_a_per_token_loss_differentiated_in_the_forward_equals_the_models_own_logits(kind, path, monkeypatch):
    """lm_head.head_loss: the loss, log-probs, entropies and every gradient equal the model's own logits' to
    1e-5 (top-p truncation on, so the truncated distribution's gradient is the one handed on), and the head runs
    once per chunk (nothing recomputed in the backward); a plain linear head's gradients by hand, a LoRA-adapted
    head's through its module."""
    monkeypatch.setattr(lm_head, "DEFAULT_CHUNK_TOKENS", 5)
    if kind == "llama-lora-head":
        import peft

        torch.manual_seed(0)
        model = peft.get_peft_model(tiny("llama"), peft.LoraConfig(r=4, target_modules=["q_proj", "lm_head"],
                                                                     init_lora_weights=False))
    else:
        model = tiny(kind)
    ids, attn, mask = batch()
    if path == "shared_prompt":
        ids[1, :3] = ids[0, :3]
    g = torch.Generator().manual_seed(2)
    inputs = {"old": -torch.rand(mask.shape, generator=g) * 3, "ref": -torch.rand(mask.shape, generator=g) * 3,
              "adv": torch.randn(mask.shape, generator=g), "weight": mask / mask.sum()}
    loss = lm_head.TokenLoss(clipped_terms, inputs)

    def run(chunk, **kw):
        monkeypatch.setattr(lm_head, "DEFAULT_CHUNK_TOKENS", chunk)
        model.zero_grad()
        if path == "packed":
            logp, more, value = packed_logp(model, ids, attn, mask, 0.7, ("entropy",), top_p=0.9, loss=loss)
        else:
            logp, more, value = token_logp(model, ids, attn, 0.7, 2 if path == "shared_prompt" else 0,
                                           [3, 3, 3, 3] if path == "shared_prompt" else None, mask, ("entropy",),
                                           top_p=0.9, loss=loss)
        assert not logp.requires_grad and value.requires_grad
        if chunk and lm_head.FUSED:  # the gradients it hands on hold no graph (no chunk's logits kept alive)
            assert all(g is None or g.grad_fn is None for g in value.grad_fn.gradients)
        value.backward()
        return value.detach(), logp, more["entropy"], {n: p.grad.clone() for n, p in model.named_parameters()
                                                       if p.grad is not None}
    want = run(0)
    run(5)  # the first forward's check of the head, not counted
    calls = []
    lm_head.unwrap(model).get_output_embeddings().register_forward_hook(
        lambda _m, args, _o: calls.append(args[0].shape[:-1].numel()))
    got = run(5)
    calls = [n for n in calls if n]  # the model's own forward asks its head for no positions
    assert max(calls) <= 5 and sum(calls) == int(mask.sum())  # each chunk once: no recompute in the backward
    monkeypatch.setattr(lm_head, "FUSED", False)
    recomputed = run(5)
    for other in (got, recomputed):
        torch.testing.assert_close(other[0], want[0], rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(other[1], want[1], rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(other[2], want[2], rtol=1e-5, atol=1e-5)
        assert other[3].keys() == want[3].keys()
        for name in want[3]:
            torch.testing.assert_close(other[3][name], want[3][name], rtol=1e-5, atol=1e-5, msg=name)


def test_a_chunks_logits_are_freed_before_the_next_chunk_makes_its_own(monkeypatch):
    """head_loss: when the head runs on a chunk, no earlier chunk's logits are alive (their gradient, made from
    them, neither): one chunk's working set at a time."""
    import weakref

    monkeypatch.setattr(lm_head, "DEFAULT_CHUNK_TOKENS", 4)
    model = tiny("qwen2-tied")
    ids, attn, mask = batch()
    inputs = {"old": torch.zeros(mask.shape), "ref": torch.zeros(mask.shape), "adv": torch.ones(mask.shape),
              "weight": mask / mask.sum()}
    loss = lm_head.TokenLoss(clipped_terms, inputs)
    token_logp(model, ids[:1], attn[:1], mask=mask[:1])  # the first forward's check of the head, not counted
    earlier, alive = [], []

    def hook(_m, args, out):
        if args[0].shape[:-1].numel():
            alive.append(sum(ref() is not None for ref in earlier))
            earlier.append(weakref.ref(out))
    model.get_output_embeddings().register_forward_hook(hook)
    value = token_logp(model, ids, attn, mask=mask, loss=loss)[-1]
    value.backward()
    assert len(alive) >= 3 and alive == [0] * len(alive)
