"""Advantage estimators against docs/algorithms.md T1, T2, T6, T8 (dynamic sampling), T9."""

import json
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from rlft.algos import (
    ADVANTAGES,
    AdvantageConfig,
    AdvantageInputs,
    dynamic_sampling_keep_mask,
    frac_zero_std_groups,
    group_stats,
    suffix_min,
)

V = json.loads((Path(__file__).resolve().parents[1] / "data" / "algorithms_vectors.json").read_text())
TOL = dict(atol=1e-6, rtol=0)


def t(x):
    return torch.tensor(x, dtype=torch.float64)


def full_mask(B, T):
    return torch.ones(B, T, dtype=torch.bool)


def run(name, scores, mask, G=1, **cfg):
    return ADVANTAGES.get(name)(AdvantageInputs(scores=scores, mask=mask, group_size=G), AdvantageConfig(**cfg))


# ------------------------------------------------------------------ T1 outcome advantages

T1_VARIANTS = {
    "grpo_unbiased_std_eps0": ("grpo", dict(eps_adv=0.0)),
    "grpo_unbiased_std_eps1e-4(TRL)": ("grpo", dict()),  # default eps_adv = 1e-4
    "grpo_unbiased_std_eps1e-6(verl)": ("grpo", dict(eps_adv=1e-6)),
    "grpo_population_std_eps0": ("grpo", dict(eps_adv=0.0, std_unbiased=False)),
    "dr_grpo_mean_only": ("dr_grpo", dict()),
    "rloo": ("rloo", dict()),
}


@pytest.mark.parametrize("case", ["r_1001", "r_285", "r_1111"])
@pytest.mark.parametrize("variant", sorted(T1_VARIANTS))
def test_t1_group_advantages_broadcast_over_tokens(case, variant):
    vec = V["T1_group_advantages"][case]
    rewards = t(vec["rewards"])
    expected = vec[variant]
    if isinstance(expected, str):  # "0/0 -> define as 0": an all-equal group gets 0
        expected = [0.0] * len(rewards)
    name, cfg = T1_VARIANTS[variant]
    out = run(name, rewards, full_mask(len(rewards), 3), G=len(rewards), **cfg)
    assert out.returns is None
    torch.testing.assert_close(out.adv, t(expected).unsqueeze(-1).expand(-1, 3), **TOL)


def test_dr_grpo_equals_grpo_without_std_scaling():
    scores, mask = t([0.2, 0.8, 0.5]), full_mask(3, 2)
    a = run("grpo", scores, mask, G=3, scale_by_std=False).adv
    torch.testing.assert_close(a, run("dr_grpo", scores, mask, G=3).adv)
    torch.testing.assert_close(a[:, 0], t([-0.3, 0.3, 0.0]))


def test_grpo_two_groups_are_normalised_separately_and_padding_gets_zero():
    # group 1 = [1, 0] -> mean 0.5, unbiased std 0.70710678 -> +-0.70710678 (eps_adv = 0)
    # group 2 = [3, 3] -> all equal -> 0
    mask = torch.tensor([[1, 1, 0], [1, 0, 0], [1, 1, 1], [0, 0, 0]], dtype=torch.bool)
    adv = run("grpo", t([1.0, 0.0, 3.0, 3.0]), mask, G=2, eps_adv=0.0).adv
    expected = t([[0.70710678, 0.70710678, 0], [-0.70710678, 0, 0], [0, 0, 0], [0, 0, 0]])
    torch.testing.assert_close(adv, expected, **TOL)


@pytest.mark.parametrize("name", ["grpo", "dr_grpo", "rloo", "grpo_process", "grpo_process_min",
                                  "reinforce_pp_baseline"])
def test_group_estimators_reject_groups_smaller_than_two(name):
    batch = AdvantageInputs(scores=t([1.0, 0.0]), mask=full_mask(2, 2), group_size=1,
                            step_ends=[[1], [1]], step_scores=[[1.0], [0.0]])
    with pytest.raises(ValueError, match="group_size >= 2"):
        ADVANTAGES.get(name)(batch, AdvantageConfig())


def test_batch_must_hold_whole_groups():
    with pytest.raises(ValueError, match="whole number of groups"):
        run("grpo", t([1.0, 0.0, 1.0]), full_mask(3, 1), G=2)


# ------------------------------------------------------------------ T2 process supervision


@pytest.mark.parametrize("ddof", [1, 0])
def test_t2_process_supervision(ddof):
    vec = V["T2_process_supervision"]
    o1, o2 = vec["inputs"]["1"], vec["inputs"]["2"]
    mask = torch.zeros(2, 6, dtype=torch.bool)
    mask[0, : o1["len"]] = True
    mask[1, : o2["len"]] = True
    batch = AdvantageInputs(
        scores=t([0.0, 0.0]), mask=mask, group_size=2,
        step_ends=[[e - 1 for e in o1["ends"]], [e - 1 for e in o2["ends"]]],  # spec ends are 1-based
        step_scores=[o1["scores"], o2["scores"]],
    )
    adv = ADVANTAGES.get("grpo_process")(batch, AdvantageConfig(eps_adv=0.0, std_unbiased=ddof == 1)).adv
    exp = vec[f"advantages_ddof{ddof}"]
    torch.testing.assert_close(adv[0], t(exp["o1"]), **TOL)
    torch.testing.assert_close(adv[1], t(exp["o2"] + [0.0, 0.0]), **TOL)


def test_process_tokens_after_last_step_end_get_zero():
    # steps [1.0] ending at column 1 and [0.0] ending at column 0; pooled mean 0.5,
    # unbiased std 0.70710678 -> normalised +-0.70710678. Row 0 response has 4 tokens,
    # but its only step ends at column 1: columns 2, 3 get 0.
    mask = full_mask(2, 4)
    batch = AdvantageInputs(scores=t([0.0, 0.0]), mask=mask, group_size=2,
                            step_ends=[[1], [0]], step_scores=[[1.0], [0.0]])
    adv = ADVANTAGES.get("grpo_process")(batch, AdvantageConfig(eps_adv=0.0)).adv
    torch.testing.assert_close(adv, t([[0.70710678, 0.70710678, 0, 0], [-0.70710678, 0, 0, 0]]), **TOL)


def test_process_supervision_with_the_outcome_adds_the_outcome_advantage_to_every_token():
    # the steps of the test above; outcome scores [1, 0] in a group of 2: grpo advantage +-0.70710678
    mask = full_mask(2, 4)
    mask[1, 3] = False  # a shorter second response: its padding stays 0
    batch = AdvantageInputs(scores=t([1.0, 0.0]), mask=mask, group_size=2,
                            step_ends=[[1], [0]], step_scores=[[1.0], [0.0]])
    process = ADVANTAGES.get("grpo_process")(batch, AdvantageConfig(eps_adv=0.0)).adv
    both = ADVANTAGES.get("grpo_process")(batch, AdvantageConfig(eps_adv=0.0, outcome_weight=0.5)).adv
    h = 0.5 * 0.70710678
    torch.testing.assert_close(both - process, t([[h, h, h, h], [-h, -h, -h, 0]]), **TOL)
    # equal outcomes carry no outcome signal: the process advantage alone
    batch.scores = t([1.0, 1.0])
    torch.testing.assert_close(ADVANTAGES.get("grpo_process")(batch, AdvantageConfig(eps_adv=0.0, outcome_weight=1.0)).adv,
                               process, **TOL)


def test_process_supervision_checks_step_lists():
    batch = AdvantageInputs(scores=t([0.0, 0.0]), mask=full_mask(2, 2), group_size=2,
                            step_ends=[[5], [0]], step_scores=[[1.0], [0.0]])
    with pytest.raises(ValueError, match="outside"):
        ADVANTAGES.get("grpo_process")(batch, AdvantageConfig())
    with pytest.raises(ValueError, match="needs step_ends"):
        run("grpo_process", t([0.0, 0.0]), full_mask(2, 2), G=2)


def test_min_form_credit_gives_each_step_the_lowest_reward_from_it_on():
    # response 0: step rewards [0.9, 0.2, 0.8] ending at columns 1, 3, 4 -> returns [0.2, 0.2, 0.8];
    # response 1: [0.6, 0.7] ending at 0, 2 -> [0.6, 0.7]. Pooled returns: mean 0.5, unbiased std
    # sqrt(0.32 / 4) = 0.28284271 -> normalised [-1.0607, -1.0607, 1.0607] and [0.3536, 0.7071].
    # The over-scored first step (0.9) of response 0 does not lift its tokens above the 0.2 that follows.
    mask = full_mask(2, 6)
    mask[1, 4:] = False
    batch = AdvantageInputs(scores=t([0.0, 0.0]), mask=mask, group_size=2,
                            step_ends=[[1, 3, 4], [0, 2]], step_scores=[[0.9, 0.2, 0.8], [0.6, 0.7]])
    adv = ADVANTAGES.get("grpo_process_min")(batch, AdvantageConfig(eps_adv=0.0)).adv
    a, b = 1.06066017, 0.35355339
    torch.testing.assert_close(adv, t([[-a, -a, -a, -a, a, 0], [b, 2 * b, 2 * b, 0, 0, 0]]), **TOL)
    # the outcome advantage adds on as in grpo_process; equal step rewards carry no process signal
    flat = AdvantageInputs(scores=t([1.0, 0.0]), mask=full_mask(2, 2), group_size=2,
                           step_ends=[[1], [1]], step_scores=[[0.5], [0.5]])
    both = ADVANTAGES.get("grpo_process_min")(flat, AdvantageConfig(eps_adv=0.0, outcome_weight=1.0)).adv
    torch.testing.assert_close(both, t([[0.70710678] * 2, [-0.70710678] * 2]), **TOL)
    with pytest.raises(ValueError, match="grpo_process_min needs step_ends"):
        run("grpo_process_min", t([0.0, 0.0]), full_mask(2, 2), G=2)


def test_suffix_min():
    assert suffix_min([0.9, 0.2, 0.8]) == [0.2, 0.2, 0.8]
    assert suffix_min([]) == []


# ------------------------------------------------------------------ T8 DAPO helpers


def test_t8_dynamic_sampling_and_zero_std_fraction():
    groups = V["T8_dapo"]["dynamic_sampling_keep"]
    names = ["q1", "q2", "q3", "q4"]
    scores = t([x for n in names for x in {"q1": [1, 1, 1, 1], "q2": [0, 0, 0, 0],
                                           "q3": [1, 0, 0, 0], "q4": [1, -1, 1, -1]}[n]])
    keep = dynamic_sampling_keep_mask(scores, 4)
    assert keep.tolist() == [groups[n] for n in names] == [False, False, True, True]
    assert float(frac_zero_std_groups(scores, 4)) == 0.5
    mean, std = group_stats(scores, 4)
    torch.testing.assert_close(mean, t([1.0, 0.0, 0.25, 0.0]))
    torch.testing.assert_close(std[:2], t([0.0, 0.0]))
    with pytest.raises(ValueError, match="group_size >= 2"):
        dynamic_sampling_keep_mask(scores, 1)


# ------------------------------------------------------------------ T9 RLOO and REINFORCE++


def test_t9_rloo_with_sequence_kl_in_reward():
    vec = V["T9_rloo_reinforcepp"]["rloo_with_seq_kl"]
    # one-token responses whose k1 = old_logp - ref_logp is the sequence KL
    batch = AdvantageInputs(scores=t(vec["scores"]), mask=full_mask(4, 1), group_size=4,
                            old_logp=t(vec["seq_k1_kl"]).unsqueeze(-1), ref_logp=torch.zeros(4, 1, dtype=torch.float64))
    adv = ADVANTAGES.get("rloo")(batch, AdvantageConfig(kl_coef=vec["beta"], kl_estimator="k1")).adv
    torch.testing.assert_close(adv[:, 0], t(vec["advantages"]), **TOL)


def test_t9_reinforce_pp_returns_and_global_whitening():
    vec = V["T9_rloo_reinforcepp"]["reinforce_pp"]
    kl = torch.zeros(2, 3, dtype=torch.float64)
    kl[0, :3], kl[1, :2] = t(vec["seqs"][0]["kl"]), t(vec["seqs"][1]["kl"])
    mask = torch.tensor([[1, 1, 1], [1, 1, 0]], dtype=torch.bool)
    batch = AdvantageInputs(scores=t([s["score"] for s in vec["seqs"]]), mask=mask,
                            old_logp=kl, ref_logp=torch.zeros_like(kl))
    out = ADVANTAGES.get("reinforce_pp")(batch, AdvantageConfig(kl_coef=vec["beta"], kl_estimator="k1"))
    ret, adv = vec["returns_to_go"], vec["normalized_advantages"]
    torch.testing.assert_close(out.returns, t([ret[0], ret[1] + [0.0]]), **TOL)
    torch.testing.assert_close(out.adv, t([adv[0], adv[1] + [0.0]]), **TOL)


def test_reinforce_pp_baseline_subtracts_group_mean_before_whitening():
    # scores [1, 0] (G = 2) -> centred [0.5, -0.5]; no KL, gamma 1: returns-to-go are the
    # centred score on every token: [.5, .5, .5] and [-.5, -.5]. Global mean 0.1,
    # population var (3*0.16 + 2*0.36)/5 = 0.24 -> std 0.48989795:
    # 0.4/0.48989795 = 0.81649658 and -0.6/0.48989795 = -1.22474487
    mask = torch.tensor([[1, 1, 1], [1, 1, 0]], dtype=torch.bool)
    out = run("reinforce_pp_baseline", t([1.0, 0.0]), mask, G=2)
    torch.testing.assert_close(out.adv, t([[0.81649658] * 3, [-1.22474487] * 2 + [0.0]]), **TOL)


def test_kl_in_reward_needs_log_probs():
    with pytest.raises(ValueError, match="needs old_logp and ref_logp"):
        run("rloo", t([1.0, 0.0]), full_mask(2, 2), G=2, kl_coef=0.1)


# ------------------------------------------------------------------ T6 PPO GAE estimator


def _t6_batch(mask):
    vec = V["T6_gae_ppo"]["rlhf_kl_shaped"]
    return vec, AdvantageInputs(scores=t([vec["rm_score"]]), mask=mask, old_logp=t([vec["logp"]]),
                                ref_logp=t([vec["logp_ref"]]), values=t([vec["values"]]))


@pytest.mark.parametrize("whiten,unbiased,key", [
    (False, True, "advantages_g1_l0.95"),
    (True, False, "whitened_adv_population_var(lm-human-prefs)"),
    (True, True, "whitened_adv_unbiased_var(TRL/verl)"),
])
def test_t6_gae_estimator_with_kl_shaped_rewards(whiten, unbiased, key):
    vec, batch = _t6_batch(full_mask(1, 4))
    cfg = AdvantageConfig(kl_coef=vec["beta"], kl_estimator="k1", gamma=1.0, lam=0.95, whiten_advantages=whiten,
                          whiten_unbiased=unbiased)
    out = ADVANTAGES.get("gae")(batch, cfg)
    torch.testing.assert_close(out.adv[0], t(vec[key]), **TOL)
    torch.testing.assert_close(out.returns[0], t(vec["returns"]), **TOL)  # returns are never whitened


def test_t6_gae_estimator_right_padding():
    exp = V["T6_gae_ppo"]["rlhf_kl_shaped_len3_padded"]
    vec, batch = _t6_batch(torch.tensor([[1, 1, 1, 0]], dtype=torch.bool))
    out = ADVANTAGES.get("gae")(batch, AdvantageConfig(kl_coef=vec["beta"], kl_estimator="k1",
                                                               whiten_advantages=False))
    torch.testing.assert_close(out.adv[0], t(exp["advantages"]), **TOL)
    torch.testing.assert_close(out.returns[0], t(exp["returns"]), **TOL)


def test_gae_estimator_needs_values():
    with pytest.raises(ValueError, match="critic values"):
        run("gae", t([1.0]), full_mask(1, 2))


# ------------------------------------------------------------------ online RFT


def test_rft_advantage_is_the_correctness_indicator():
    mask = torch.tensor([[1, 1], [1, 0], [1, 1], [1, 1]], dtype=torch.bool)
    adv = run("rft", t([1.0, 1.0, 0.0, -1.0]), mask).adv
    torch.testing.assert_close(adv, t([[1, 1], [1, 0], [0, 0], [0, 0]]))
    adv = run("rft", t([0.9, 0.4, 0.0, 1.0]), mask, rft_threshold=0.5).adv
    torch.testing.assert_close(adv[:, 0], t([1, 0, 0, 1]))


# ----------------------------------------------------------------------------- whitening over ranks
def _thread_all_reduce(world: int):
    """A sum over `world` threads standing in for ranks (each calls it the same number of times)."""
    import threading

    barrier, slots = threading.Barrier(world), {}

    def make(rank):
        def reduce(t):
            slots[rank] = t.clone()
            barrier.wait()
            total = sum(slots[r] for r in range(world))
            barrier.wait()
            return total
        return reduce
    return make


@pytest.mark.parametrize("estimator", ["gae", "reinforce_pp"])
def test_whitening_with_a_rank_reduce_equals_whitening_the_whole_batch(estimator):
    import threading

    torch.manual_seed(0)
    B, T = 6, 7
    mask = (torch.rand(B, T) > 0.3).double()
    mask[:, 0] = 1
    batch = AdvantageInputs(scores=torch.randn(B, dtype=torch.float64), mask=mask, group_size=1,
                            old_logp=-torch.rand(B, T, dtype=torch.float64),
                            ref_logp=-torch.rand(B, T, dtype=torch.float64),
                            values=torch.randn(B, T, dtype=torch.float64))
    cfg = AdvantageConfig(kl_coef=0.1, whiten_advantages=True)
    whole = ADVANTAGES.get(estimator)(batch, cfg).adv

    def shard(rows):
        return AdvantageInputs(scores=batch.scores[rows], mask=mask[rows], group_size=1,
                               old_logp=batch.old_logp[rows], ref_logp=batch.ref_logp[rows],
                               values=batch.values[rows])

    make, parts = _thread_all_reduce(2), {}

    def rank(r):
        rows = slice(r * 3, r * 3 + 3)
        parts[r] = ADVANTAGES.get(estimator)(shard(rows), replace(cfg, reduce=make(r))).adv

    threads = [threading.Thread(target=rank, args=(r,)) for r in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    torch.testing.assert_close(torch.cat([parts[0], parts[1]]), whole, rtol=1e-12, atol=1e-12)
    # without the reduce each half is whitened on its own, which differs
    alone = ADVANTAGES.get(estimator)(shard(slice(0, 3)), cfg).adv
    assert (alone - whole[:3]).abs().max() > 1e-3


# ------------------------------------------------------------------ on-policy distillation (docs/algorithms.md §16)


def test_distill_advantage_is_the_per_token_negative_reverse_kl_of_the_sampled_tokens():
    old = t([[-0.5, -1.25, -2.0, -0.1], [-3.0, -0.25, -0.75, -1.5]])
    teacher = t([[-0.25, -2.0, -2.0, -4.0], [-1.0, -0.5, -0.125, -9.0]])
    # row 0: the last column is padding; row 1: column 1 is an environment token (multi-turn), column 3 padding
    mask = torch.tensor([[1, 1, 1, 0], [1, 0, 1, 0]], dtype=torch.bool)
    batch = AdvantageInputs(scores=t([1.0, 0.0]), mask=mask, group_size=2, old_logp=old, teacher_logp=teacher)
    adv = ADVANTAGES.get("distill")(batch, AdvantageConfig(distill_coef=2.0)).adv
    # by hand: 2 x (log pi_teacher - log pi_old) where the mask is set, 0 elsewhere
    expected = t([[2 * 0.25, 2 * -0.75, 0.0, 0.0], [2 * 2.0, 0.0, 2 * 0.625, 0.0]])
    torch.testing.assert_close(adv, expected, atol=0, rtol=0)
    # with the outcome reward: + outcome_weight x the group-normalised advantage on every model token
    both = ADVANTAGES.get("distill")(batch, AdvantageConfig(distill_coef=2.0, outcome_weight=0.5, eps_adv=0.0)).adv
    grpo = ADVANTAGES.get("grpo")(batch, AdvantageConfig(eps_adv=0.0)).adv
    torch.testing.assert_close(both, expected + 0.5 * grpo, **TOL)
    assert both[1, 1] == 0 and both[0, 3] == 0  # environment and padding tokens carry nothing
    # a teacher identical to the student: zero advantage
    same = AdvantageInputs(scores=t([1.0, 0.0]), mask=mask, group_size=2, old_logp=old, teacher_logp=old.clone())
    assert not ADVANTAGES.get("distill")(same, AdvantageConfig()).adv.any()
    with pytest.raises(ValueError, match="teacher"):
        ADVANTAGES.get("distill")(AdvantageInputs(scores=t([1.0, 0.0]), mask=mask, old_logp=old), AdvantageConfig())
