"""DPO, Bradley-Terry and process-RM losses against docs/algorithms.md §2, §5, §9, T5 and T11."""

import json
import math
from pathlib import Path

import pytest
import torch

from rlft.algos import (
    bradley_terry_loss,
    dpo_loss,
    math_shepherd_labels,
    prm_bce_loss,
    solution_score_min,
)

V = json.loads((Path(__file__).resolve().parents[1] / "data" / "algorithms_vectors.json").read_text())
T5, T11 = V["T5_dpo_bt"], V["T11_math_shepherd"]
TOL = dict(atol=1e-6, rtol=0)


def t(x, grad=False):
    return torch.tensor(x, dtype=torch.float64, requires_grad=grad)


@pytest.mark.parametrize("case,beta", [("ex1_beta0.1", 0.1), ("ex2_beta0.5", 0.5)])
def test_t5_dpo_loss_metrics_and_gradients(case, beta):
    exp = T5[case]
    s_w, s_l = t([exp["logp_w"]], grad=True), t([exp["logp_l"]], grad=True)
    loss, metrics = dpo_loss(s_w, s_l, t([exp["ref_w"]]), t([exp["ref_l"]]), beta)
    torch.testing.assert_close(loss, t([exp["loss"]]), **TOL)
    torch.testing.assert_close(metrics["margin"], t(exp["margin"]), **TOL)
    torch.testing.assert_close(metrics["chosen_reward"], t(exp["chosen_reward"]), **TOL)
    torch.testing.assert_close(metrics["rejected_reward"], t(exp["rejected_reward"]), **TOL)
    assert metrics["accuracy"].item() == float(exp["margin"] > 0)
    loss.sum().backward()
    torch.testing.assert_close(s_w.grad, t([exp["dLoss/dlogp_chosen"]]), **TOL)
    torch.testing.assert_close(s_l.grad, t([exp["dLoss/dlogp_rejected"]]), **TOL)
    # unified-paradigm gradient coefficient (§5): beta * sigma(h_l - h_w)
    assert -s_w.grad.item() == pytest.approx(exp["grad_coef=beta*sigmoid(-margin)"], abs=1e-6)


def test_dpo_length_normalised_log_ratios():
    # DeepSeekMath Eq. 12: (s_w - ref_w)/|o_w| = (-10 + 11)/4 = 0.25, (s_l - ref_l)/|o_l| = (-12 + 11)/2 = -0.5
    # margin = 0.1 * 0.75 = 0.075; loss = log(1 + e^-0.075)
    loss, metrics = dpo_loss(t([-10.0]), t([-12.0]), t([-11.0]), t([-11.0]), 0.1,
                             length_normalize=True, len_w=t([4.0]), len_l=t([2.0]))
    assert loss.item() == pytest.approx(math.log1p(math.exp(-0.075)), abs=1e-12)
    assert metrics["margin"].item() == pytest.approx(0.075)
    with pytest.raises(ValueError, match="len_w"):
        dpo_loss(t([-10.0]), t([-12.0]), t([-11.0]), t([-11.0]), 0.1, length_normalize=True)


def test_dpo_is_stable_for_huge_margins():
    loss, _ = dpo_loss(t([0.0, -5000.0]), t([-5000.0, 0.0]), t([0.0, 0.0]), t([0.0, 0.0]), 1.0)
    assert loss[0].item() == 0.0 and loss[1].item() == pytest.approx(5000.0)


def test_t5_bradley_terry_pair():
    exp = T5["bradley_terry_rm"]
    loss = bradley_terry_loss(t([exp["r_w"]]), t([exp["r_l"]]))
    torch.testing.assert_close(loss, t([exp["loss"]]), **TOL)
    assert math.exp(-loss.item()) == pytest.approx(exp["P(w>l)"], abs=1e-6)
    # per-prompt shift invariance (§2.1)
    torch.testing.assert_close(bradley_terry_loss(t([exp["r_w"] + 3.0]), t([exp["r_l"] + 3.0])), loss)


def test_t11_prm_bce_sum_and_mean_over_steps():
    exp = T11["prm_bce"]
    probs, labels = t([exp["pred_step_scores"]]), t([exp["hard_labels"]])
    mask = torch.ones(1, 3, dtype=torch.bool)
    total = prm_bce_loss(probs, labels, mask, from_logits=False)
    torch.testing.assert_close(total, t([exp["loss_sum_over_steps"]]), **TOL)
    logits = torch.log(probs / (1 - probs))
    torch.testing.assert_close(prm_bce_loss(logits, labels, mask), total, **TOL)
    torch.testing.assert_close(prm_bce_loss(logits, labels, mask, reduction="mean"), total / 3, **TOL)
    # masking the third step leaves -(log 0.8 + log 0.6)
    mask2 = torch.tensor([[1, 1, 0]], dtype=torch.bool)
    torch.testing.assert_close(prm_bce_loss(logits, labels, mask2), t([-(math.log(0.8) + math.log(0.6))]), **TOL)
    with pytest.raises(ValueError, match="reduction"):
        prm_bce_loss(logits, labels, mask, reduction="max")


def test_t11_solution_score_and_labels():
    exp = T11["prm_bce"]
    probs = t([exp["pred_step_scores"]])
    assert solution_score_min(probs).tolist() == [exp["solution_score_min"]]
    assert solution_score_min(probs, torch.tensor([[1, 1, 0]], dtype=torch.bool)).tolist() == [0.6]
    hard, soft = math_shepherd_labels(torch.tensor([T11["completions_reaching_gold"], 0]), T11["N"])
    assert hard.tolist() == [T11["hard_label"], 0.0]
    assert soft.tolist() == [T11["soft_label"], 0.0]


def test_prm_bce_good_weight_scales_the_good_steps_term():
    logits = t([[0.3, -1.2, 2.0]])
    labels = t([[1.0, 0.0, 1.0]])
    mask = t([[1.0, 1.0, 1.0]])
    probs = torch.sigmoid(logits)
    expected = -(3.0 * torch.log(probs[0, 0]) + torch.log(1 - probs[0, 1]) + 3.0 * torch.log(probs[0, 2]))
    torch.testing.assert_close(prm_bce_loss(logits, labels, mask, good_weight=3.0), expected[None], **TOL)
    torch.testing.assert_close(prm_bce_loss(probs, labels, mask, from_logits=False, good_weight=3.0), expected[None],
                               **TOL)
    torch.testing.assert_close(prm_bce_loss(logits, labels, mask, good_weight=1.0), prm_bce_loss(logits, labels, mask))


def test_offline_dpo_takes_pairs_of_the_policys_samples(monkeypatch):
    """algo.source=policy: DPO's training and held-out pairs come from policy_data (the RM's sampled pairs),
    the held-out ones capped at algo.num_eval_pairs; source=data: the data's pairs, nothing sampled."""
    from omegaconf import OmegaConf

    from rlft.stages import dpo, inputs, policy_data

    calls = []

    def sampled(cfg, tok, split, count, device):
        calls.append((split, count))
        return [{"split": split, "i": i} for i in range(count + 2)], {f"{split}_samples": 8.0 * count}

    monkeypatch.setattr(policy_data, "pair_examples", sampled)
    monkeypatch.setattr(inputs, "pair_examples", lambda cfg, tok, split: [{"data": split}] * 5)
    cfg = OmegaConf.create({"algo": {"source": "policy", "num_prompts": 6, "num_eval_pairs": 3}})
    train, test, info = dpo.pairs(cfg, None, "cpu")
    assert calls == [("train", 6), ("test", 3)]
    assert len(train) == 8 and len(test) == 3 and {ex["split"] for ex in test} == {"test"}
    assert info == {"train_samples": 48.0, "test_samples": 24.0}
    cfg.algo.source = "data"
    train, test, info = dpo.pairs(cfg, None, "cpu")
    assert train == [{"data": "train"}] * 5 and test == [{"data": "test"}] * 3 and info == {}
    assert len(calls) == 2
