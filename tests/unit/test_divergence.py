"""Full-distribution distillation divergences (rlft/algos/divergence.py) against hand computation in float64, and
the chunked head's teacher term (lm_head.TeacherTerm) against the two models' own logits: values and gradients
to 1e-5 in fp32, padded, packed and with shared prompts."""
from __future__ import annotations

import math

import pytest
import torch

from rlft.algos.divergence import DIVERGENCES, coarsen, token_divergence
from rlft.rollout import lm_head
from rlft.rollout.logprobs import packed_logp, token_logp
from test_lm_head import batch, grads_of, tiny

S = [0.5, 0.3, 0.2]  # the student's distribution over three tokens
T = [0.1, 0.6, 0.3]  # the teacher's


def log(p):
    return torch.tensor([p], dtype=torch.float64).log()


def test_forward_and_reverse_kl_are_the_hand_computed_sums():
    forward = sum(t * math.log(t / s) for s, t in zip(S, T))
    reverse = sum(s * math.log(s / t) for s, t in zip(S, T))
    assert DIVERGENCES.get("forward_kl")(log(S), log(T)).item() == pytest.approx(forward, abs=1e-12)
    assert DIVERGENCES.get("reverse_kl")(log(S), log(T)).item() == pytest.approx(reverse, abs=1e-12)


@pytest.mark.parametrize("beta", [0.1, 0.5, 0.9])
def test_jsd_is_the_beta_mixture_of_the_two_kls_to_the_mixture(beta):
    m = [beta * t + (1 - beta) * s for s, t in zip(S, T)]
    want = beta * sum(t * math.log(t / mm) for t, mm in zip(T, m)) + \
        (1 - beta) * sum(s * math.log(s / mm) for s, mm in zip(S, m))
    assert DIVERGENCES.get("jsd")(log(S), log(T), beta).item() == pytest.approx(want, abs=1e-12)
    with pytest.raises(ValueError):
        DIVERGENCES.get("jsd")(log(S), log(T), 1.0)


@pytest.mark.parametrize("kind", ["forward_kl", "reverse_kl", "jsd"])
def test_each_divergence_is_zero_with_zero_gradient_at_the_teacher_and_positive_elsewhere(kind):
    g = torch.Generator().manual_seed(0)
    teacher = torch.randn(6, 11, generator=g, dtype=torch.float64)
    student = teacher.clone().requires_grad_(True)
    d = token_divergence(student, teacher, kind)
    d.sum().backward()
    assert d.abs().max().item() < 1e-12 and student.grad.abs().max().item() < 1e-12
    other = torch.randn(6, 11, generator=g, dtype=torch.float64)
    assert (token_divergence(other, teacher, kind) > 0).all()


def test_top_k_with_a_rest_bucket_is_a_lower_bound_that_is_exact_over_the_whole_vocabulary():
    g = torch.Generator().manual_seed(1)
    student, teacher = torch.randn(5, 13, generator=g, dtype=torch.float64), torch.randn(5, 13, generator=g,
                                                                                     dtype=torch.float64)
    s, t = coarsen(student.log_softmax(-1), teacher.log_softmax(-1), 4)
    assert s.shape == (5, 5) and torch.allclose(s.exp().sum(-1), torch.ones(5, dtype=torch.float64))
    assert torch.allclose(t.exp().sum(-1), torch.ones(5, dtype=torch.float64))
    for kind in ("forward_kl", "reverse_kl"):
        full = token_divergence(student, teacher, kind)
        assert (token_divergence(student, teacher, kind, top_k=4) <= full + 1e-12).all()  # coarsening loses
        torch.testing.assert_close(token_divergence(student, teacher, kind, top_k=13), full)
        torch.testing.assert_close(token_divergence(student, teacher, kind, top_k=0), full)


def reference(student, teacher, ids, attn, mask, temperature, kind, top_k):
    """From both models' own logits: the divergence at every target column, 0 outside the mask."""
    s = student(input_ids=ids, attention_mask=attn).logits[:, :-1].float() / temperature
    with torch.no_grad():
        t = teacher(input_ids=ids, attention_mask=attn).logits[:, :-1].float() / temperature
    d = token_divergence(s.flatten(0, 1), t.flatten(0, 1), kind, 0.3, top_k).view(s.shape[:2])
    return d * mask


@pytest.mark.parametrize("kind,top_k", [("forward_kl", 0), ("reverse_kl", 0), ("jsd", 0), ("jsd", 7)])
@pytest.mark.parametrize("path", ["padded", "packed", "shared_prompt"])
def test_the_chunked_teacher_term_equals_the_divergence_of_the_models_own_logits(kind, top_k, path, monkeypatch):
    monkeypatch.setattr(lm_head, "DEFAULT_CHUNK_TOKENS", 5)  # several chunks, the last one short
    student, teacher = tiny("qwen2-tied"), tiny("llama")  # another seed's weights: an untied teacher head
    torch.manual_seed(3)
    teacher = type(teacher)(teacher.config)
    with torch.no_grad():
        teacher.lm_head.weight.mul_(30.0)  # a sharp teacher: divergences of order 1, not 1e-3
    ids, attn, mask = batch()
    if path == "shared_prompt":  # rows 0 and 1 share their first 3 tokens as one prompt
        ids[1, :3] = ids[0, :3]
    want = reference(student, teacher, ids, attn, mask, 0.7, kind, top_k)
    g_want = grads_of(student, want)
    term = lm_head.TeacherTerm(teacher, kind, 0.3, top_k)
    if path == "packed":
        _, extra = packed_logp(student, ids, attn, mask, 0.7, term=term)
    else:
        _, extra = token_logp(student, ids, attn, 0.7, 2 if path == "shared_prompt" else 0,
                              [3, 3, 3, 3] if path == "shared_prompt" else None, mask, term=term)
    got = extra["divergence"]
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    assert want.sum() > 1.0  # two different models: not a comparison of zeros
    g_got = grads_of(student, got)
    assert g_got.keys() == g_want.keys() and not any(p.grad is not None for p in teacher.parameters())
    for name in g_want:
        torch.testing.assert_close(g_got[name], g_want[name], rtol=1e-5, atol=1e-5, msg=name)


def test_a_teacher_with_another_vocabulary_size_is_one_line():
    student, teacher = tiny("qwen2-tied"), tiny("llama")
    teacher.resize_token_embeddings(teacher.config.vocab_size + 3)
    ids, attn, mask = batch()
    with pytest.raises(Exception) as info:
        token_logp(student, ids, attn, 1.0, 0, None, mask, term=lm_head.TeacherTerm(teacher, "forward_kl"))
    assert "same vocabulary" in str(info.value) and "\n" not in str(info.value)
