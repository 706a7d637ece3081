"""Padding-free packing (train.packing): one row per micro-batch, positions restarting per sequence, equal
per-token log-probs, entropies and gradients to the padded forward (1e-5, fp32) on ragged batches."""
import pytest
import torch
import transformers

from rlft.rollout.logprobs import pack, packed_logp, padding_fraction, token_logp
from rlft.rollout.logprobs import forward_logits


def entropy(logits):
    logp = torch.log_softmax(logits.float(), -1)
    return -(logp.exp() * logp).sum(-1)


def model():
    cfg = transformers.LlamaConfig(vocab_size=60, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                   num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=64)
    torch.manual_seed(0)
    return transformers.AutoModelForCausalLM.from_config(cfg)


def ragged(lengths, side="right"):
    L = max(lengths)
    ids, attn = torch.zeros(len(lengths), L, dtype=torch.long), torch.zeros(len(lengths), L, dtype=torch.long)
    g = torch.Generator().manual_seed(1)
    for i, n in enumerate(lengths):
        cols = slice(0, n) if side == "right" else slice(L - n, L)
        ids[i, cols] = torch.randint(3, 60, (n,), generator=g)
        attn[i, cols] = 1
    return ids, attn


def response_mask(attn, prompt_len=3):
    """Target-aligned response mask: every target after the first prompt_len tokens of each row."""
    positions = attn.long().cumsum(-1) - 1  # position of each token in its sequence
    return ((positions[:, 1:] >= prompt_len) & attn[:, 1:].bool()).float()


def test_pack_restarts_positions_per_sequence():
    ids, attn = ragged([2, 4, 1])
    p = pack(ids, attn)
    assert p.input_ids.shape == (1, 7) and p.position_ids.tolist() == [[0, 1, 0, 1, 2, 3, 0]]
    assert p.rows.tolist() == [0, 0, 1, 1, 1, 1, 2]
    assert padding_fraction(attn) == pytest.approx(1 - 7 / 12)


@pytest.mark.parametrize("side", ["right", "left"])
def test_packed_log_probs_entropy_and_gradients_equal_the_padded_forward(side):
    m = model()
    ids, attn = ragged([5, 11, 4, 8, 9], side)
    mask = response_mask(attn)
    padded = token_logp(m, ids, attn, 0.7) * mask
    packed, extra = packed_logp(m, ids, attn, mask, 0.7, ("entropy", "top1"))
    torch.testing.assert_close(packed, padded, rtol=1e-5, atol=1e-5)
    logits = forward_logits(m, ids, attn, 0, 0.7)
    torch.testing.assert_close(extra["entropy"], entropy(logits) * mask, rtol=1e-5, atol=1e-5)
    assert torch.equal(extra["top1"], (logits.argmax(-1) == ids[:, 1:]).float() * mask)
    # gradients of a loss over the masked tokens
    padded.sum().backward()
    grads = {n: p.grad.clone() for n, p in m.named_parameters()}
    m.zero_grad()
    packed_logp(m, ids, attn, mask, 0.7).sum().backward()
    for n, p in m.named_parameters():
        torch.testing.assert_close(p.grad, grads[n], rtol=1e-4, atol=1e-6, msg=n)
