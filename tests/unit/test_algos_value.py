"""GAE, KL-shaped rewards, whitening, value loss against docs/algorithms.md §1, §3 and T6."""

import json
from pathlib import Path

import pytest
import torch

from rlft.algos import (
    agg_denominator,
    explained_variance,
    gae,
    kl_shaped_rewards,
    masked_mean,
    masked_var,
    sequence_logp,
    value_loss,
    whiten,
)

V = json.loads((Path(__file__).resolve().parents[1] / "data" / "algorithms_vectors.json").read_text())
T6 = V["T6_gae_ppo"]
TOL = dict(atol=1e-6, rtol=0)


def t(x, grad=False):
    return torch.tensor(x, dtype=torch.float64, requires_grad=grad)


@pytest.mark.parametrize("gamma,lam", [(1.0, 0.95), (0.99, 0.95), (1.0, 1.0), (1.0, 0.0)])
def test_t6_gae(gamma, lam):
    vec = T6[f"gamma{gamma}_lambda{lam}"]
    adv, ret = gae(t([vec["rewards"]]), t([vec["values"]]), torch.ones(1, 4, dtype=torch.bool), gamma, lam)
    torch.testing.assert_close(adv[0], t(vec["advantages"]), **TOL)
    torch.testing.assert_close(ret[0], t(vec["returns"]), **TOL)


def test_t6_kl_shaped_rewards():
    vec = T6["rlhf_kl_shaped"]
    r = kl_shaped_rewards(t([vec["logp"]]), t([vec["logp_ref"]]), t([vec["rm_score"]]),
                          torch.ones(1, 4, dtype=torch.bool), vec["beta"])
    torch.testing.assert_close(r[0], t(vec["token_rewards"]), **TOL)


def test_t6_right_padding_puts_score_on_last_valid_token_and_stops_gae_there():
    vec, exp = T6["rlhf_kl_shaped"], T6["rlhf_kl_shaped_len3_padded"]
    mask = torch.tensor([[1, 1, 1, 0]], dtype=torch.bool)
    r = kl_shaped_rewards(t([vec["logp"]]), t([vec["logp_ref"]]), t([vec["rm_score"]]), mask, vec["beta"])
    torch.testing.assert_close(r[0], t(exp["token_rewards"]), **TOL)
    values = t([vec["values"][:3] + [55.0]])  # the padded value must not leak into V_{T+1}
    adv, ret = gae(r, values, mask, 1.0, 0.95)
    torch.testing.assert_close(adv[0], t(exp["advantages"]), **TOL)
    torch.testing.assert_close(ret[0], t(exp["returns"]), **TOL)


def test_gae_rows_are_independent_in_a_padded_batch():
    rewards = t([[0.0, 0.0, 0.0, 1.0], [0.0, 0.0, 1.0, 0.0]])
    values = t([[0.5, 0.6, 0.7, 0.8], [0.5, 0.6, 0.7, 9.0]])
    mask = torch.tensor([[1, 1, 1, 1], [1, 1, 1, 0]], dtype=torch.bool)
    adv, _ = gae(rewards, values, mask, 1.0, 0.95)
    torch.testing.assert_close(adv[0], t(T6["gamma1.0_lambda0.95"]["advantages"]), **TOL)
    # row 2, by hand: delta = [0.1, 0.1, 0.3]; A3 = 0.3, A2 = 0.1 + 0.95*0.3 = 0.385,
    # A1 = 0.1 + 0.95*0.385 = 0.46575
    torch.testing.assert_close(adv[1], t([0.46575, 0.385, 0.3, 0.0]), **TOL)


@pytest.mark.parametrize("unbiased,key", [
    (False, "whitened_adv_population_var(lm-human-prefs)"),
    (True, "whitened_adv_unbiased_var(TRL/verl)"),
])
def test_t6_whitening_ignores_masked_entries(unbiased, key):
    vec = T6["rlhf_kl_shaped"]
    x = t([vec["advantages_g1_l0.95"] + [1e6, float("nan")]])
    mask = torch.tensor([[1, 1, 1, 1, 0, 0]], dtype=torch.bool)
    w = whiten(x, mask, unbiased=unbiased)
    torch.testing.assert_close(w[0, :4], t(vec[key]), **TOL)
    assert w[0, 4:].tolist() == [0.0, 0.0]


def test_whiten_without_mean_shift_keeps_the_mean():
    # rewards whitening (lm-human-preferences): scale by 1/std, keep the mean
    x = t([[1.0, 2.0, 6.0]])
    mask = torch.ones(1, 3, dtype=torch.bool)
    w = whiten(x, mask, shift_mean=False)
    torch.testing.assert_close(w - masked_mean(x, mask), whiten(x, mask))
    torch.testing.assert_close(masked_mean(w, mask), t(3.0))


def test_masked_helpers_three_elements():
    # valid [1, 2, 6]: sum 9, mean 3, population var (4+1+9)/3 = 14/3, unbiased 14/2 = 7
    x = t([[1.0, 2.0, 6.0, 100.0]])
    mask = torch.tensor([[1, 1, 1, 0]], dtype=torch.bool)
    assert sequence_logp(x, mask).tolist() == [9.0]
    assert masked_mean(x, mask).item() == pytest.approx(3.0)
    assert masked_var(x, mask, unbiased=False).item() == pytest.approx(14 / 3)
    assert masked_var(x, mask).item() == pytest.approx(7.0)


def test_t6_value_clip_loss_and_zero_gradient():
    vec = T6["value_clip"]
    values = t([[vec["v_new"]]], grad=True)
    loss, metrics = value_loss(values, t([[vec["v_old"]]]), t([[vec["return"]]]),
                               torch.ones(1, 1, dtype=torch.bool), vec["cliprange_value"])
    torch.testing.assert_close(loss, t(vec["loss=0.5*max((v-R)^2,(vclip-R)^2)"]), **TOL)
    loss.backward()
    assert values.grad.item() == vec["dLoss/dv_new"] == 0.0
    assert metrics["vf_clipfrac"].item() == 1.0


def test_value_loss_three_tokens_token_mean():
    # V_old = 0.5, eps 0.2, R = 1:
    #   V = 0.9: max((-0.1)^2, (0.7-1)^2) = 0.09 (clipped, zero grad)
    #   V = 0.6: max((-0.4)^2, (0.6-1)^2) = 0.16 (inside the range, grad (V-R)/3 = -0.4/3)
    #   V = 0.1: max((-0.9)^2, (0.3-1)^2) = 0.81 (unclipped is larger, grad -0.9/3)
    # loss = 0.5 * (0.09 + 0.16 + 0.81) / 3 = 0.17666667
    values = t([[0.9, 0.6, 0.1, 7.0]], grad=True)
    mask = torch.tensor([[1, 1, 1, 0]], dtype=torch.bool)
    loss, _ = value_loss(values, t([[0.5] * 4]), t([[1.0] * 4]), mask, 0.2)
    assert loss.item() == pytest.approx(0.17666667, abs=1e-8)
    loss.backward()
    torch.testing.assert_close(values.grad, t([[0.0, -0.4 / 3, -0.9 / 3, 0.0]]))
    # no clipping: 0.5 * (0.01 + 0.16 + 0.81) / 3
    loss, metrics = value_loss(values, t([[0.5] * 4]), t([[1.0] * 4]), mask, None)
    assert loss.item() == pytest.approx(0.5 * 0.98 / 3) and metrics["vf_clipfrac"].item() == 0.0
    # a global denominator of 6 tokens halves the micro-batch's share
    loss, _ = value_loss(values, t([[0.5] * 4]), t([[1.0] * 4]), mask, 0.2, agg_denominator(torch.ones(2, 3)))
    assert loss.item() == pytest.approx(0.17666667 / 2, abs=1e-8)


def test_explained_variance():
    returns = t([[1.0, 2.0, 3.0, 4.0]])
    mask = torch.ones(1, 4, dtype=torch.bool)
    assert explained_variance(returns, returns, mask).item() == pytest.approx(1.0)
    assert explained_variance(torch.full_like(returns, 2.5), returns, mask).item() == pytest.approx(0.0)
    # residual [1, 1, 1, 1] - constant offset: Var 0 -> 1
    assert explained_variance(returns - 1.0, returns, mask).item() == pytest.approx(1.0)
