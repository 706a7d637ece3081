"""Token-level policy losses against docs/algorithms.md §1, §4, §5 and T3."""

import json
import math
from pathlib import Path

import pytest
import torch

from rlft.algos import AGGREGATIONS, KL_ESTIMATORS, POLICY_LOSSES, PolicyLossConfig

V = json.loads((Path(__file__).resolve().parents[1] / "data" / "algorithms_vectors.json").read_text())
T3 = V["T3_grpo_clipped_loss"]
TOL = dict(atol=1e-6, rtol=0)


def t(x, grad=False):
    return torch.tensor(x, dtype=torch.float64, requires_grad=grad)


def ones(*shape):
    return torch.ones(*shape, dtype=torch.bool)


@pytest.mark.parametrize("adv", [+1.0, -1.0])
def test_t3_grpo_token_loss_values_and_gradients(adv):
    exp = T3[f"seqA_adv{adv:+.0f}"]
    seq = T3["seqA"]
    logp = t([seq["logp_new"]], grad=True)
    old_logp, ref_logp, mask = t([seq["logp_old"]]), t([seq["logp_ref"]]), ones(1, 3)
    A = torch.full((1, 3), adv, dtype=torch.float64)

    pg, metrics = POLICY_LOSSES.get("ppo_clip")(logp, old_logp, A, mask, PolicyLossConfig(clip_eps_low=0.2, clip_eps_high=0.2))
    torch.testing.assert_close(-pg[0], t(exp["surrogate_min"]), **TOL)
    assert float(metrics["clipfrac"]) == pytest.approx(sum(exp["clipped(zero pg grad)"]) / 3)
    torch.testing.assert_close(metrics["ratio_mean"], t(exp["ratio"]).mean(), **TOL)

    kl = KL_ESTIMATORS.get("k3")(logp, ref_logp)
    torch.testing.assert_close(kl[0], t(exp["k3_kl"]), **TOL)
    per_token = pg + T3["beta"] * kl
    torch.testing.assert_close(per_token[0], t(exp["per_token_loss(-surr+beta*k3)"]), **TOL)

    agg = AGGREGATIONS.get("seq-mean-token-mean")
    torch.testing.assert_close(agg(per_token, mask), t(exp["seq_loss_token_mean"]), **TOL)
    torch.testing.assert_close(agg(pg, mask), t(exp["seq_loss_pg_only"]), **TOL)

    # dl_t/dlogp_t before the 1/|o| factor: differentiate the token SUM
    (grad,) = torch.autograd.grad(per_token.sum(), logp, retain_graph=True)
    torch.testing.assert_close(grad[0], t(exp["dLoss_dlogp_new_per_token(before 1/|o|)"]), **TOL)

    # the clipped token carries no policy-gradient signal
    (grad_pg,) = torch.autograd.grad(pg.sum(), logp)
    clipped = torch.tensor(exp["clipped(zero pg grad)"])
    assert torch.all(grad_pg[0][clipped] == 0) and torch.all(grad_pg[0][~clipped] != 0)


def test_t3_dapo_clip_higher():
    exp = T3["dapo_clip_higher_token3"]
    logp, old_logp = t([[-0.2]], grad=True), t([[-0.5]])  # ratio exp(0.3) = 1.34985881
    cfg = PolicyLossConfig(clip_eps_low=exp["eps_low"], clip_eps_high=exp["eps_high"])
    loss, metrics = POLICY_LOSSES.get("ppo_clip")(logp, old_logp, t([[exp["A"]]]), ones(1, 1), cfg)
    torch.testing.assert_close(-loss[0, 0], t(exp["surrogate"]), **TOL)  # 1.28
    assert float(metrics["clipfrac"]) == 1.0 and exp["clipped"]
    # with eps_high 0.4 the same token is inside the range: surrogate = ratio
    loss, _ = POLICY_LOSSES.get("ppo_clip")(logp, old_logp, t([[1.0]]), ones(1, 1), PolicyLossConfig(clip_eps_high=0.4))
    torch.testing.assert_close(-loss[0, 0], t(exp["ratio"]), **TOL)


def test_tie_between_branches_uses_the_unclipped_branch():
    # choose logp - old_logp with exp(.) == 1.2 exactly, the upper clip bound
    x = torch.tensor(math.log(1.2), dtype=torch.float64)
    while torch.exp(x) != 1.2:
        x = torch.nextafter(x, torch.tensor(1.0, dtype=torch.float64))
    assert torch.exp(x).item() == 1.2
    logp = x.reshape(1, 1).clone().requires_grad_(True)
    loss, metrics = POLICY_LOSSES.get("ppo_clip")(logp, t([[0.0]]), t([[1.0]]), ones(1, 1), PolicyLossConfig())
    loss.sum().backward()
    assert float(metrics["clipfrac"]) == 0.0
    assert logp.grad.item() == pytest.approx(-1.2)  # -rho * A flows


def test_dual_clip_caps_negative_advantage_losses():
    # A = -1 everywhere, eps 0.2, c = 3, ratios [5, 2, 0.5]:
    #   rho = 5:   -min(-5, -1.2) = 5   -> capped at -c*A = 3, zero gradient
    #   rho = 2:   -min(-2, -1.2) = 2   -> below the cap, gradient -rho*A = 2
    #   rho = 0.5: -min(-0.5, -0.8) = 0.8 (clipped branch, zero gradient), below the cap
    logp = t([[math.log(5.0), math.log(2.0), math.log(0.5)]], grad=True)
    A = t([[-1.0, -1.0, -1.0]])
    loss, metrics = POLICY_LOSSES.get("ppo_clip")(logp, torch.zeros(1, 3, dtype=torch.float64), A, ones(1, 3),
                                                  PolicyLossConfig(dual_clip_c=3.0))
    torch.testing.assert_close(loss, t([[3.0, 2.0, 0.8]]), **TOL)
    loss.sum().backward()
    torch.testing.assert_close(logp.grad, t([[0.0, 2.0, 0.0]]), **TOL)
    assert float(metrics["clipfrac_dual"]) == pytest.approx(1 / 3)
    # a positive advantage is never dual-clipped: rho = 5, A = +1 -> -1.2
    loss, _ = POLICY_LOSSES.get("ppo_clip")(t([[math.log(5.0)]]), t([[0.0]]), t([[1.0]]), ones(1, 1),
                                            PolicyLossConfig(dual_clip_c=3.0))
    torch.testing.assert_close(loss, t([[-1.2]]), **TOL)
    with pytest.raises(ValueError, match="dual_clip_c"):
        POLICY_LOSSES.get("ppo_clip")(t([[0.0]]), t([[0.0]]), t([[-1.0]]), ones(1, 1), PolicyLossConfig(dual_clip_c=1.0))


def test_on_policy_ratio_is_exactly_one_with_gradient_minus_advantage():
    # mu = 1: rho = exp(logp - sg(logp)) == 1, the clip is inactive, dl/dlogp = -A
    logp = t([[-0.3, -2.0, -7.5]], grad=True)
    A = t([[0.5, -1.5, 2.0]])
    loss, metrics = POLICY_LOSSES.get("ppo_clip")(logp, None, A, ones(1, 3), PolicyLossConfig())
    torch.testing.assert_close(loss, -A)
    assert float(metrics["ratio_mean"]) == 1.0 and float(metrics["clipfrac"]) == 0.0
    loss.sum().backward()
    torch.testing.assert_close(logp.grad, -A)


def test_reinforce_with_rft_advantage_has_indicator_gradient_coefficient():
    # online RFT: A = I(correct) = [1, 0, 1]; l_t = -A logp_t, so dl/dlogp = -I(o) (GC = I(o))
    logp = t([[-1.0, -2.0], [-0.5, -0.1], [-3.0, -4.0]], grad=True)
    A = t([[1.0, 1.0], [0.0, 0.0], [1.0, 1.0]])
    mask = torch.tensor([[1, 1], [1, 1], [1, 0]], dtype=torch.bool)
    loss, metrics = POLICY_LOSSES.get("reinforce")(logp, None, A, mask, PolicyLossConfig())
    torch.testing.assert_close(loss, t([[1.0, 2.0], [0.0, 0.0], [3.0, 0.0]]))
    loss.sum().backward()
    torch.testing.assert_close(logp.grad, t([[-1.0, -1.0], [0.0, 0.0], [-1.0, 0.0]]))
    assert float(metrics["clipfrac"]) == 0.0


@pytest.mark.parametrize("name", ["ppo_clip", "reinforce"])
def test_masked_tokens_give_zero_loss_and_zero_gradient(name):
    # padding holds TRL's INVALID_LOGPROB = 1 and a huge old log-prob gap; it must not leak
    logp = t([[-1.0, 1.0, 1.0]], grad=True)
    old_logp = t([[-1.1, -50.0, 1.0]])
    A = t([[1.0, 7.0, float("nan")]])
    mask = torch.tensor([[1, 0, 0]], dtype=torch.bool)
    loss, metrics = POLICY_LOSSES.get(name)(logp, old_logp, A, mask, PolicyLossConfig())
    assert loss[0, 1:].tolist() == [0.0, 0.0]
    loss.sum().backward()
    assert logp.grad[0, 1:].tolist() == [0.0, 0.0] and logp.grad[0, 0] != 0
    assert torch.isfinite(metrics["ratio_mean"])
