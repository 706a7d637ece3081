"""Loss aggregation modes against docs/algorithms.md §0 and T3, plus micro-batch exactness."""

import json
from pathlib import Path

import pytest
import torch

from rlft.algos import AGGREGATIONS, AggDenominator, agg_denominator, aggregate

V = json.loads((Path(__file__).resolve().parents[1] / "data" / "algorithms_vectors.json").read_text())
AGG = V["T3_grpo_clipped_loss"]["aggregation_beta0"]
TOL = dict(atol=1e-6, rtol=0)


def t(x):
    return torch.tensor(x, dtype=torch.float64)


def t3_batch():
    # row A: 3 tokens, row B: 2 tokens + 1 padding column holding garbage
    loss = t([AGG["per_token_loss_A"], AGG["per_token_loss_B"] + [123.0]])
    mask = torch.tensor([[1, 1, 1], [1, 1, 0]], dtype=torch.bool)
    return loss, mask


@pytest.mark.parametrize("mode,key", [
    ("seq-mean-token-mean", "seq_mean_token_mean(GRPO paper)"),
    ("token-mean", "token_mean(DAPO / TRL bnpo)"),
    ("constant-norm", "constant_norm(Dr.GRPO, L=4, G=2)"),
    ("seq-mean-token-sum", "seq_mean_token_sum"),
])
def test_t3_aggregation_modes(mode, key):
    loss, mask = t3_batch()
    denom = agg_denominator(mask, max_len=4)
    assert denom == AggDenominator(num_seqs=2.0, num_tokens=5.0, max_len=4.0)
    torch.testing.assert_close(AGGREGATIONS.get(mode)(loss, mask, denom), t(AGG[key]), **TOL)


def test_worked_three_token_example():
    # l = [1, 2, 3] / [4, pad, pad]:  lengths 3 and 1
    #   seq-mean-token-mean = (2 + 4) / 2 = 3      token-mean = 10 / 4 = 2.5
    #   seq-mean-token-sum  = (6 + 4) / 2 = 5      constant-norm(L=5) = 10 / (2 * 5) = 1
    loss = t([[1.0, 2.0, 3.0], [4.0, 9.0, 9.0]])
    mask = torch.tensor([[1, 1, 1], [1, 0, 0]], dtype=torch.bool)
    expected = {"seq-mean-token-mean": 3.0, "token-mean": 2.5, "seq-mean-token-sum": 5.0}
    for mode, value in expected.items():
        assert aggregate(loss, mask, mode).item() == pytest.approx(value)
    assert aggregate(loss, mask, "constant-norm", agg_denominator(mask, max_len=5)).item() == pytest.approx(1.0)
    # without a denominator constant-norm uses the padded width T = 3: 10 / 6
    assert aggregate(loss, mask, "constant-norm").item() == pytest.approx(10 / 6)


@pytest.mark.parametrize("mode", ["seq-mean-token-mean", "token-mean", "seq-mean-token-sum", "constant-norm"])
def test_micro_batches_with_global_denominator_sum_to_the_full_batch(mode):
    g = torch.Generator().manual_seed(0)
    loss = torch.randn(7, 6, generator=g, dtype=torch.float64)
    lengths = torch.tensor([6, 1, 3, 0, 5, 2, 4])  # one fully masked row
    mask = torch.arange(6) < lengths.unsqueeze(-1)
    full_denom = agg_denominator(mask, max_len=8)
    full = aggregate(loss, mask, mode, full_denom)

    slices = [slice(0, 2), slice(2, 3), slice(3, 7)]
    parts = [aggregate(loss[s], mask[s], mode, full_denom) for s in slices]
    torch.testing.assert_close(sum(parts), full, atol=1e-12, rtol=0)

    # the denominators of the micro-batches add up to the full one (what an all-reduce would sum)
    summed = agg_denominator(mask[slices[0]], 8) + agg_denominator(mask[slices[1]], 8) + agg_denominator(mask[slices[2]], 8)
    assert summed == full_denom

    # gradients match too
    leaf = loss.clone().requires_grad_(True)
    aggregate(leaf, mask, mode, full_denom).backward()
    leaf_mb = loss.clone().requires_grad_(True)
    sum(aggregate(leaf_mb[s], mask[s], mode, full_denom) for s in slices).backward()
    torch.testing.assert_close(leaf_mb.grad, leaf.grad, atol=1e-12, rtol=0)


def test_per_micro_batch_denominators_would_be_wrong():
    # the reason for global counts: averaging micro-batch token-means is not the token-mean
    loss = t([[1.0, 1.0, 1.0], [4.0, 0.0, 0.0]])
    mask = torch.tensor([[1, 1, 1], [1, 0, 0]], dtype=torch.bool)
    full = aggregate(loss, mask, "token-mean")  # 7 / 4
    local = (aggregate(loss[:1], mask[:1], "token-mean") + aggregate(loss[1:], mask[1:], "token-mean")) / 2  # (1 + 4) / 2
    assert full.item() == pytest.approx(1.75) and local.item() == pytest.approx(2.5)


def test_empty_mask_gives_zero_not_nan():
    loss = t([[1.0, 2.0]])
    mask = torch.zeros(1, 2, dtype=torch.bool)
    for mode in AGGREGATIONS.names():
        assert aggregate(loss, mask, mode).item() == 0.0
