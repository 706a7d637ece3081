import pytest

from rlft.algos import ADVANTAGES, AGGREGATIONS, IS_CORRECTIONS, KL_ESTIMATORS, PAIRWISE_LOSSES, POLICY_LOSSES
from rlft.registry import Registry, UnknownNameError


def test_register_get_and_names_sorted():
    reg = Registry("widget")

    @reg.register("zeta")
    def zeta():
        return "z"

    @reg.register("alpha")
    def alpha():
        return "a"

    assert reg.get("zeta") is zeta and reg.get("alpha")() == "a"
    assert reg.names() == ["alpha", "zeta"]
    assert "alpha" in reg and "beta" not in reg and len(reg) == 2


def test_unknown_name_is_a_one_line_keyerror_listing_valid_names():
    reg = Registry("widget")
    reg.register("b")(lambda: None)
    reg.register("a")(lambda: None)
    with pytest.raises(KeyError) as info:
        reg.get("c")
    assert isinstance(info.value, UnknownNameError)
    assert str(info.value) == "unknown widget 'c'; valid: a, b"


def test_duplicate_registration_rejected():
    reg = Registry("widget")
    reg.register("a")(lambda: None)
    with pytest.raises(ValueError, match="already registered"):
        reg.register("a")(lambda: None)


def test_algorithm_registries_expose_the_documented_names():
    assert ADVANTAGES.names() == [
        "distill", "dr_grpo", "gae", "grpo", "grpo_process", "grpo_process_min", "reinforce_pp", "reinforce_pp_baseline",
        "rft", "rloo",
    ]
    assert POLICY_LOSSES.names() == ["gspo", "ppo_clip", "reinforce"]
    assert IS_CORRECTIONS.names() == ["mis", "none", "tis"]
    assert PAIRWISE_LOSSES.names() == ["dpo", "p3o_joint", "p3o_separate", "p3o_separate_tokenwise"]
    assert KL_ESTIMATORS.names() == ["k1", "k2", "k3"]
    assert AGGREGATIONS.names() == ["constant-norm", "seq-mean-token-mean", "seq-mean-token-sum", "token-mean"]
    with pytest.raises(UnknownNameError, match="unknown advantage estimator 'foo'; valid: distill, dr_grpo, gae"):
        ADVANTAGES.get("foo")
