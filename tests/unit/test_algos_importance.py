"""Trainer-mismatch importance sampling (rlft/algos/importance.py) and GSPO, against worked vectors.

Vectors (worked by hand below):
    old    = [[-1.0, -2.0, -0.5], [-0.3, -1.2, 0.0]]
    engine = [[-1.5, -1.9, -0.5], [-0.3, -0.2, 0.0]]      mask = [[1, 1, 1], [1, 1, 0]]
    old - engine = [[0.5, -0.1, 0.0], [0.0, -1.0, -]]
    token ratios   [[e^0.5 = 1.6487213, e^-0.1 = 0.9048374, 1], [1, e^-1 = 0.3678794, -]]
    sequence sums  [0.4, -1.0] -> ratios [e^0.4 = 1.4918247, 0.3678794]
"""
import math

import pytest
import torch

from rlft.algos import AGGREGATIONS, IS_CORRECTIONS, POLICY_LOSSES, AggDenominator, ISConfig, PolicyLossConfig

OLD = torch.tensor([[-1.0, -2.0, -0.5], [-0.3, -1.2, 0.0]], dtype=torch.float64)
ENGINE = torch.tensor([[-1.5, -1.9, -0.5], [-0.3, -0.2, 0.0]], dtype=torch.float64)
MASK = torch.tensor([[1.0, 1, 1], [1, 1, 0]], dtype=torch.float64)
E05, EM01, EM1, E04 = math.exp(0.5), math.exp(-0.1), math.exp(-1.0), math.exp(0.4)


def weights(name, level, cap):
    w, keep, m = IS_CORRECTIONS.get(name)(OLD, ENGINE, MASK, ISConfig(level, cap))
    return w, m, keep


@pytest.mark.parametrize("name", ["tis", "mis", "none"])
@pytest.mark.parametrize("level", ["token", "sequence"])
def test_weights_are_exactly_one_when_the_engine_agrees(name, level):
    w, keep, m = IS_CORRECTIONS.get(name)(OLD, OLD.clone(), MASK, ISConfig(level, 2.0))
    assert torch.equal(w, MASK) and torch.equal(keep, MASK)
    assert float(m["engine_logp_gap_mean"]) == 0.0 and float(m["engine_logp_gap_max"]) == 0.0
    assert float(m["is_corrected_frac"]) == 0.0


def test_token_level_tis_truncates_and_mis_masks_at_the_cap():
    w, m, keep = weights("tis", "token", 1.5)
    torch.testing.assert_close(w, torch.tensor([[1.5, EM01, 1.0], [1.0, EM1, 0.0]], dtype=torch.float64))
    assert torch.equal(keep, MASK)
    assert float(m["is_corrected_frac"]) == pytest.approx(1 / 5)
    assert float(m["engine_logp_gap_mean"]) == pytest.approx((0.5 + 0.1 + 0 + 0 + 1.0) / 5)
    assert float(m["engine_logp_gap_max"]) == pytest.approx(1.0)
    w, m, keep = weights("mis", "token", 1.5)  # the token past the cap leaves the loss and the counts
    assert keep.tolist() == [[0.0, 1.0, 1.0], [1.0, 1.0, 0.0]] and torch.equal(w, keep)
    assert float(m["is_corrected_frac"]) == pytest.approx(1 / 5)


def test_sequence_level_weights_are_the_product_of_token_ratios():
    w, m, _ = weights("tis", "sequence", 2.0)
    torch.testing.assert_close(w, torch.tensor([[E04] * 3, [EM1, EM1, 0.0]], dtype=torch.float64))
    w, m, _ = weights("tis", "sequence", 1.4)
    torch.testing.assert_close(w, torch.tensor([[1.4] * 3, [EM1, EM1, 0.0]], dtype=torch.float64))
    assert float(m["is_corrected_frac"]) == pytest.approx(3 / 5)
    _, _, keep = weights("mis", "sequence", 1.4)
    assert keep.tolist() == [[0.0] * 3, [1.0, 1.0, 0.0]]


def test_corrected_loss_and_gradient_on_a_synthetic_mismatch():
    """On-policy ppo_clip with A = 1 gives l_t = -1 (gradient -1 per token); TIS (token, C = 1.5)
    multiplies each token by w, token-mean over the 5 tokens:
        loss = -(1.5 + e^-0.1 + 1 + 1 + e^-1) / 5 = -0.9545434,   d loss / d logp_t = -w_t / 5."""
    logp = OLD.clone().requires_grad_(True)
    w, _, _ = weights("tis", "token", 1.5)
    loss_tok, _ = POLICY_LOSSES.get("ppo_clip")(logp, None, torch.ones_like(MASK), MASK, PolicyLossConfig())
    loss = AGGREGATIONS.get("token-mean")(loss_tok * w, MASK, AggDenominator(num_seqs=2, num_tokens=5, max_len=3))
    loss.backward()
    assert loss.item() == pytest.approx(-(1.5 + EM01 + 1 + 1 + EM1) / 5, abs=1e-12)
    torch.testing.assert_close(logp.grad, -w / 5)


def test_unknown_level_is_refused():
    with pytest.raises(ValueError, match="unknown importance-sampling level 'x'; valid: token, sequence"):
        weights("tis", "x", 2.0)


def test_gspo_one_length_normalised_ratio_per_sequence():
    """logp = [-1, -2, -3], old = [-1.1, -2.2, -2.6]: mean log-ratio (0.1 + 0.2 - 0.4) / 3 = -1/30,
    s = e^(-1/30) = 0.9672161. A = 1 (eps 0.2): l_t = -s, aggregated (seq-mean-token-mean) -s, and
    d/d logp_t = -s / 3. A = -1 with eps_low = 0.02: clip(s) = 0.98 > s, so the clipped branch
    -0.98 * -1 = 0.98 is the loss and the gradient is 0 for the whole sequence."""
    s = math.exp(-1 / 30)
    old = torch.tensor([[-1.1, -2.2, -2.6]], dtype=torch.float64)
    mask = torch.ones(1, 3, dtype=torch.float64)
    agg = AGGREGATIONS.get("seq-mean-token-mean")
    denom = AggDenominator(num_seqs=1, num_tokens=3, max_len=3)
    logp = torch.tensor([[-1.0, -2.0, -3.0]], dtype=torch.float64, requires_grad=True)
    loss_tok, m = POLICY_LOSSES.get("gspo")(logp, old, torch.ones_like(mask), mask, PolicyLossConfig())
    torch.testing.assert_close(loss_tok, torch.full((1, 3), -s, dtype=torch.float64))
    agg(loss_tok, mask, denom).backward()
    torch.testing.assert_close(logp.grad, torch.full((1, 3), -s / 3, dtype=torch.float64))
    assert float(m["clipfrac"]) == 0.0
    logp.grad = None
    loss_tok, m = POLICY_LOSSES.get("gspo")(logp, old, -torch.ones_like(mask), mask, PolicyLossConfig(0.02, 0.02))
    torch.testing.assert_close(loss_tok, torch.full((1, 3), 0.98, dtype=torch.float64))
    agg(loss_tok, mask, denom).backward()
    assert torch.equal(logp.grad, torch.zeros_like(logp))
    assert float(m["clipfrac"]) == 1.0


def test_gspo_on_policy_equals_the_token_policy_gradient():
    """old_logp = None: s = 1 and the gradient is -A grad(logp) per token, as ppo_clip's."""
    logp = torch.tensor([[-1.0, -0.5], [-2.0, -0.1]], dtype=torch.float64, requires_grad=True)
    adv = torch.tensor([[0.5, 0.5], [-1.0, -1.0]], dtype=torch.float64)
    mask = torch.tensor([[1.0, 1.0], [1.0, 0.0]], dtype=torch.float64)
    g_loss, _ = POLICY_LOSSES.get("gspo")(logp, None, adv, mask, PolicyLossConfig())
    (g,) = torch.autograd.grad(g_loss.sum(), logp)
    p_loss, _ = POLICY_LOSSES.get("ppo_clip")(logp, None, adv, mask, PolicyLossConfig())
    (p,) = torch.autograd.grad(p_loss.sum(), logp)
    torch.testing.assert_close(g_loss, p_loss)
    torch.testing.assert_close(g, p)


def test_t12_vectors_of_the_specification():
    """T12: GSPO's sequence ratios and loss; TIS token and sequence weights, MIS keep mask and the
    mean |delta| on a ragged batch (lengths 3 and 2)."""
    import json
    from pathlib import Path

    v = json.loads((Path(__file__).parents[1] / "data" / "algorithms_vectors.json").read_text())["T12_gspo_tis"]

    def padded(rows):
        return torch.tensor([r + [0.0] * (3 - len(r)) for r in rows], dtype=torch.float64)

    mask = torch.tensor([[1.0, 1, 1], [1, 1, 0]], dtype=torch.float64)
    logp, old, eng = padded(v["logp_new"]), padded(v["logp_old"]), padded(v["logp_engine"])
    adv = torch.tensor(v["adv"], dtype=torch.float64)[:, None].expand(2, 3)
    loss_tok, m = POLICY_LOSSES.get("gspo")(logp, old, adv, mask, PolicyLossConfig(v["eps_low"], v["eps_high"]))
    terms = (loss_tok * mask).sum(-1) / mask.sum(-1)
    torch.testing.assert_close(terms, torch.tensor(v["gspo_seq_loss_terms"], dtype=torch.float64), atol=1e-6, rtol=0)
    agg = AGGREGATIONS.get("seq-mean-token-mean")(loss_tok, mask, AggDenominator(num_seqs=2, num_tokens=5, max_len=3))
    assert float(agg) == pytest.approx(v["gspo_loss_mean_over_sequences"], abs=1e-6)
    cfg = ISConfig("token", v["cap_C"])
    w, keep, metrics = IS_CORRECTIONS.get("tis")(old, eng, mask, cfg)
    torch.testing.assert_close(w, padded(v["tis_token_weights"]), atol=1e-6, rtol=0)
    assert float(metrics["engine_logp_gap_mean"]) == pytest.approx(v["mismatch_mean_abs"], abs=1e-9)
    _, keep, _ = IS_CORRECTIONS.get("mis")(old, eng, mask, cfg)
    assert keep.tolist() == padded(v["mis_token_keep"]).tolist()
    w, _, _ = IS_CORRECTIONS.get("tis")(old, eng, mask, ISConfig("sequence", v["cap_C"]))
    torch.testing.assert_close(w[:, 0], torch.tensor(v["tis_sequence_weights(product)"], dtype=torch.float64),
                               atol=1e-6, rtol=0)
