"""KL estimators and controllers against docs/algorithms.md §1, §3, T4 and T6."""

import json
from pathlib import Path

import pytest
import torch

from rlft.algos import KL_ESTIMATORS, AdaptiveKLController

V = json.loads((Path(__file__).resolve().parents[1] / "data" / "algorithms_vectors.json").read_text())
T4 = V["T4_kl_estimators"]
TOL = dict(atol=1e-6, rtol=0)

CASES = [(-0.5, -1.0), (-1.0, -0.5), (-2.0, -2.0)]
KEYS = {
    "k1": "k1=logp-logp_ref",
    "k2": "k2=0.5*(logp-logp_ref)^2",
    "k3": "k3=exp(logp_ref-logp)-(logp_ref-logp)-1",
}


def t(x, grad=False):
    return torch.tensor(x, dtype=torch.float64, requires_grad=grad)


@pytest.mark.parametrize("name", ["k1", "k2", "k3"])
def test_t4_estimator_values(name):
    logp, ref_logp = t([c[0] for c in CASES]), t([c[1] for c in CASES])
    expected = t([T4[f"logp={lp},logp_ref={lr}"][KEYS[name]] for lp, lr in CASES])
    torch.testing.assert_close(KL_ESTIMATORS.get(name)(logp, ref_logp), expected, **TOL)


def test_t4_k3_gradient_is_grpo_coefficient():
    # d(beta k3)/dlogp = beta (1 - pi_ref/pi) = -(beta (pi_ref/pi - 1)), DeepSeekMath Eq. 21
    logp = t([c[0] for c in CASES], grad=True)
    ref_logp = t([c[1] for c in CASES])
    (0.04 * KL_ESTIMATORS.get("k3")(logp, ref_logp)).sum().backward()
    coef = t([T4[f"logp={lp},logp_ref={lr}"]["GRPO_grad_coef_beta0.04=beta*(pi_ref/pi-1)"] for lp, lr in CASES])
    torch.testing.assert_close(logp.grad, -coef, **TOL)


def test_t4_exact_expectations_over_a_three_outcome_distribution():
    exp = T4["exact_expectation_check"]
    q, p = t(exp["q(policy)"]), t(exp["p(ref)"])
    logq, logp_ref = q.log(), p.log()  # samples come from q = pi_theta
    expect = {name: (q * KL_ESTIMATORS.get(name)(logq, logp_ref)).sum() for name in ("k1", "k2", "k3")}
    torch.testing.assert_close(expect["k1"], t(exp["KL(q||p) exact"]), **TOL)
    torch.testing.assert_close(expect["k3"], t(exp["E_q[k3]"]), **TOL)
    torch.testing.assert_close(expect["k2"], t(exp["E_q[k2]"]), **TOL)  # biased: differs from KL
    assert abs(expect["k2"].item() - exp["KL(q||p) exact"]) > 1e-4


def test_verl_clamps_on_extreme_log_ratios():
    # log(pi_ref/pi) = 30 is clamped to 20; k3 = e^20 - 21 is then clamped to 10
    logp, ref_logp = t([-40.0, -10.0]), t([-10.0, -40.0])
    torch.testing.assert_close(KL_ESTIMATORS.get("k1")(logp, ref_logp), t([-20.0, 20.0]))
    torch.testing.assert_close(KL_ESTIMATORS.get("k2")(logp, ref_logp), t([200.0, 200.0]))
    # lambda = -20 side: e^-20 + 20 - 1 = 19.000000002 -> 10
    torch.testing.assert_close(KL_ESTIMATORS.get("k3")(logp, ref_logp), t([10.0, 10.0]))
    assert torch.isfinite(KL_ESTIMATORS.get("k3")(t([-1e6]), t([0.0]))).all()


def test_t6_adaptive_kl_controller():
    exp = V["T6_gae_ppo"]["adaptive_kl"]
    ctl = AdaptiveKLController(exp["beta"], exp["target"], exp["horizon"])
    assert ctl.update(exp["current_kl"], exp["n_steps"]) == pytest.approx(exp["new_beta"], abs=1e-9)
    assert ctl.value == pytest.approx(0.101024, abs=1e-9)
    # KL below target: 4/6 - 1 = -1/3, clipped to -0.2 -> beta * (1 - 0.2 * 512 / 1e4)
    ctl = AdaptiveKLController(0.1, 6.0, 10000)
    assert ctl.update(4.0, 512) == pytest.approx(0.1 * (1 - 0.2 * 0.0512), abs=1e-12)
    # inside the band: 6.6/6 - 1 = 0.1 -> beta * (1 + 0.1 * 0.0512)
    ctl = AdaptiveKLController(0.1, 6.0, 10000)
    assert ctl.update(6.6, 512) == pytest.approx(0.1 * (1 + 0.1 * 0.0512), abs=1e-12)
    with pytest.raises(ValueError):
        AdaptiveKLController(0.1, 0.0, 10000)
