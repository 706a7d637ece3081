"""P3O pairwise losses against docs/algorithms.md §10 and T7."""

import json
from pathlib import Path

import pytest
import torch

from rlft.algos import (PairCounts, PairLossConfig, p3o_aggregate, p3o_joint, p3o_pair_indices, p3o_reward_delta,
                        p3o_separate, p3o_separate_tokenwise)

P3O = {"joint": p3o_joint, "separate": p3o_separate, "separate_tokenwise": p3o_separate_tokenwise}

V = json.loads((Path(__file__).resolve().parents[1] / "data" / "algorithms_vectors.json").read_text())
T7 = V["T7_p3o"]
TOL = dict(atol=1e-6, rtol=0)
CFG = PairLossConfig(eps=T7["common"]["eps"], c=T7["common"]["c"], kl_coef=T7["common"]["beta"])


def t(x, grad=False):
    return torch.tensor(x, dtype=torch.float64, requires_grad=grad)


def seq_pair(case):
    """One pair whose responses are single 'tokens' carrying the whole sequence log-prob."""
    s_old = case.get("s_old", T7["common"]["s_old"])
    s1, s2 = t([[case["s"][0]]], grad=True), t([[case["s"][1]]], grad=True)
    old1, old2 = t([[s_old[0]]]), t([[s_old[1]]])
    mask = torch.ones(1, 1, dtype=torch.bool)
    return s1, old1, mask, s2, old2, mask


CASES = {
    "caseA_inside": {},
    "caseB_outside": {},
    "caseC_reversed_pref": {},
    "caseB_reward_shift_+5": {},
    "caseB_swapped_labels": {"s_old": [-12.0, -10.0], "s_ref": [-11.5, -10.5]},
}


def delta_for(name):
    case = T7[name]
    s_old = CASES[name].get("s_old", T7["common"]["s_old"])
    s_ref = CASES[name].get("s_ref", T7["common"]["s_ref"])
    return p3o_reward_delta(t([[case["r1"], case["r2"]]]), t([s_old]), t([s_ref]), T7["common"]["beta"])


@pytest.mark.parametrize("name", sorted(CASES))
@pytest.mark.parametrize("mode,key", [("joint", "V2_joint"), ("separate", "V1_separate")])
def test_t7_p3o_loss_and_sequence_gradients(name, mode, key):
    case = T7[name]
    delta = delta_for(name)
    torch.testing.assert_close(delta, t([case["Delta"]]), **TOL)
    s1, old1, mask, s2, old2, _ = seq_pair({**case, **CASES[name]})
    loss, metrics = P3O[mode](s1, old1, mask, s2, old2, mask, delta, CFG)
    exp = case[key]
    torch.testing.assert_close(loss, t([exp["loss"]]), **TOL)
    loss.sum().backward()
    assert s1.grad.item() == pytest.approx(exp["dL/ds1"], abs=1e-6)
    assert s2.grad.item() == pytest.approx(exp["dL/ds2"], abs=1e-6)
    if mode == "joint":
        assert metrics["clipfrac"].item() == float(exp["clipped"])
        torch.testing.assert_close(metrics["is_weight_mean"], t(case["w=clip(rho1*rho2,1/c,c)"]), **TOL)


def test_t7_reward_shift_invariance_and_mirror_symmetry():
    b, shifted, swapped = T7["caseB_outside"], T7["caseB_reward_shift_+5"], T7["caseB_swapped_labels"]
    assert delta_for("caseB_reward_shift_+5").item() == pytest.approx(delta_for("caseB_outside").item(), abs=1e-12)
    for mode, key in [("joint", "V2_joint"), ("separate", "V1_separate")]:
        out = {}
        for name in ("caseB_outside", "caseB_swapped_labels"):
            s1, old1, mask, s2, old2, _ = seq_pair({**T7[name], **CASES[name]})
            loss, _ = P3O[mode](s1, old1, mask, s2, old2, mask, delta_for(name), CFG)
            loss.sum().backward()
            out[name] = (loss.item(), s1.grad.item(), s2.grad.item())
        # labels swapped: same loss, gradients trade places
        assert out["caseB_swapped_labels"][0] == pytest.approx(out["caseB_outside"][0], abs=1e-9)
        assert out["caseB_swapped_labels"][1] == pytest.approx(out["caseB_outside"][2], abs=1e-9)
        assert out["caseB_swapped_labels"][2] == pytest.approx(out["caseB_outside"][1], abs=1e-9)
        assert swapped[key]["loss"] == b[key]["loss"] == shifted[key]["loss"]


@pytest.mark.parametrize("mode", ["joint", "separate"])
def test_token_level_inputs_match_sequence_inputs(mode):
    # case A spread over 3 tokens per response plus padding; per-token gradient = sequence gradient
    case = T7["caseA_inside"]
    logp1 = t([[-4.0, -3.0, case["s"][0] + 7.0, 99.0]], grad=True)
    old1 = t([[-4.5, -2.5, -10.0 + 7.0, 99.0]])
    logp2 = t([[-6.0, case["s"][1] + 6.0, 5.0, 5.0]], grad=True)
    old2 = t([[-6.0, -12.0 + 6.0, 0.0, 0.0]])
    mask1 = torch.tensor([[1, 1, 1, 0]], dtype=torch.bool)
    mask2 = torch.tensor([[1, 1, 0, 0]], dtype=torch.bool)
    loss, _ = P3O[mode](logp1, old1, mask1, logp2, old2, mask2, delta_for("caseA_inside"), CFG)
    key = "V2_joint" if mode == "joint" else "V1_separate"
    torch.testing.assert_close(loss, t([case[key]["loss"]]), **TOL)
    loss.sum().backward()
    g1, g2 = case[key]["dL/ds1"], case[key]["dL/ds2"]
    torch.testing.assert_close(logp1.grad, t([[g1, g1, g1, 0.0]]), **TOL)
    torch.testing.assert_close(logp2.grad, t([[g2, g2, 0.0, 0.0]]), **TOL)


def test_separate_tokenwise_clips_per_token():
    # Delta = 0.95; sequence log-ratios: y1 (-1 - 2) - (-1.3 - 1.9) = 0.2, y2 -0.05
    # -> w = exp(0.15) = 1.16183424, omega = -Delta w = -1.10374253.
    # y1 token 0: logp - old = +0.3 > eps with omega < 0 -> clipped, zero gradient;
    # y1 token 1: -0.1 inside -> gradient omega; y2 tokens inside -> gradient -omega.
    delta = t([0.95])
    logp1, old1 = t([[-1.0, -2.0]], grad=True), t([[-1.3, -1.9]])
    logp2, old2 = t([[-0.55, -3.0, 0.0]], grad=True), t([[-0.5, -3.0, 0.0]])
    mask1 = torch.ones(1, 2, dtype=torch.bool)
    mask2 = torch.tensor([[1, 1, 0]], dtype=torch.bool)
    loss, metrics = p3o_separate_tokenwise(logp1, old1, mask1, logp2, old2, mask2, delta, CFG)
    omega = -0.95 * 1.16183424
    # value: y1 max(omega*-1, omega*-1.1) + omega*-2 ; y2: -omega*-0.55 - omega*-3
    expected = (omega * -1.1) + omega * -2.0 + omega * 0.55 + omega * 3.0
    assert loss.item() == pytest.approx(expected, abs=1e-6)
    assert metrics["clipfrac"].item() == pytest.approx(1 / 4)
    loss.sum().backward()
    torch.testing.assert_close(logp1.grad, t([[0.0, omega]]), **TOL)
    torch.testing.assert_close(logp2.grad, t([[-omega, -omega, 0.0]]), **TOL)
    # aggregation: separate_tokenwise divides by the 4 valid tokens of both responses
    counts = PairCounts(pairs=1.0, tokens=4.0)
    assert p3o_aggregate(loss, counts, tokenwise=True).item() == pytest.approx(expected / 4, abs=1e-6)


def test_p3o_aggregate_means_over_pairs_and_adds_up_over_micro_batches():
    loss = t([0.3, -0.1, 0.7])
    counts = PairCounts(pairs=3.0, tokens=12.0)  # 3 pairs, 12 tokens of both responses
    assert p3o_aggregate(loss, counts).item() == pytest.approx(0.9 / 3)
    # the authors' token average: the per-pair losses' 1/2 is undone (2 x 0.9 over 12 tokens)
    assert p3o_aggregate(loss, counts, avg_tokenwise=True).item() == pytest.approx(2 * 0.9 / 12)
    parts = p3o_aggregate(loss[:1], counts) + p3o_aggregate(loss[1:], counts)
    assert parts.item() == pytest.approx(0.9 / 3)


def test_pair_indices_are_disjoint_consecutive_within_groups():
    idx1, idx2 = p3o_pair_indices(8, 4)
    assert idx1.tolist() == [0, 2, 4, 6] and idx2.tolist() == [1, 3, 5, 7]
    with pytest.raises(ValueError, match="even"):
        p3o_pair_indices(6, 3)
    with pytest.raises(ValueError, match="whole number"):
        p3o_pair_indices(6, 4)
