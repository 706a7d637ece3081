"""pass@k and maj@k against docs/algorithms.md §11 and T10."""

import json
from math import comb
from pathlib import Path

import pytest
import torch

from rlft.eval.metrics import maj_at_k, mean_maj_at_k, mean_pass_at_k, pass_at_k

V = json.loads((Path(__file__).resolve().parents[1] / "data" / "algorithms_vectors.json").read_text())
T10 = V["T10_passk_majk"]


@pytest.mark.parametrize("key", [k for k in T10 if k.startswith("n=")])
def test_t10_pass_at_k(key):
    n, c, k = (int(part.split("=")[1]) for part in key.split(","))
    assert pass_at_k(n, c, k) == pytest.approx(T10[key], abs=1e-6)


def test_pass_at_k_matches_the_binomial_form():
    for n in range(1, 12):
        for c in range(n + 1):
            for k in range(1, n + 1):
                exact = 1.0 - comb(n - c, k) / comb(n, k)
                assert pass_at_k(n, c, k) == pytest.approx(exact, abs=1e-12)
    # and is not the biased 1 - (1 - c/n)^k
    assert pass_at_k(5, 2, 2) == pytest.approx(0.7)
    assert abs(pass_at_k(5, 2, 2) - (1 - (1 - 0.4) ** 2)) > 0.05


def test_pass_at_k_rejects_bad_arguments():
    for n, c, k in [(5, 6, 1), (5, 2, 0), (5, 2, 6), (5, -1, 1)]:
        with pytest.raises(ValueError):
            pass_at_k(n, c, k)


def test_mean_pass_at_k():
    assert mean_pass_at_k([(5, 2), (10, 0)], 1) == pytest.approx((0.4 + 0.0) / 2)
    with pytest.raises(ValueError):
        mean_pass_at_k([], 1)


def test_t10_maj_at_k():
    exp = T10["maj@5"]
    assert maj_at_k(exp["answers"], exp["majority"], 5) == 1.0
    assert maj_at_k(exp["answers"], exp["gold"], 5) == exp["maj@5"] == 0.0  # all 5: one subset
    assert maj_at_k(exp["answers"][:3], exp["gold"], 3) == exp["maj@3(first 3)"]
    assert maj_at_k(exp["answers"], "12", 5) == 1.0


def test_maj_at_k_is_the_expectation_over_k_subsets():
    answers = ["12", "12", "7", "12", "7"]  # 3 x "12", 2 x "7"
    # k=1: a single random answer, so maj@1 = pass@1 = c/n
    assert maj_at_k(answers, "7", 1) == pytest.approx(2 / 5) == pytest.approx(pass_at_k(5, 2, 1))
    # k=3 over the 10 subsets: "7" wins only in the one subset {7, 7, 12} x 3 choices of the "12" = 3 subsets
    assert maj_at_k(answers, "7", 3) == pytest.approx(3 / 10)
    # k=2: {7,7} wins (1 subset), {7,12} ties (6 subsets, credit 1/2 each), {12,12} loses (3)
    assert maj_at_k(answers, "7", 2) == pytest.approx((1 + 6 * 0.5) / 10)
    # never above pass@k for the same samples
    for k in range(1, 6):
        assert maj_at_k(answers, "7", k) <= pass_at_k(5, 2, k) + 1e-12


def test_maj_at_k_draws_subsets_when_there_are_too_many():
    answers = ["1"] * 20 + ["2"] * 12  # C(32, 16) subsets: estimated by seeded draws
    value = maj_at_k(answers, "1", 16)
    assert value == maj_at_k(answers, "1", 16)  # seeded
    assert 0.7 < value < 1.0


def test_maj_at_k_ties_none_and_normalisation():
    # 2-2 tie between "7" and "12": the vote of all four gives each half the credit
    assert maj_at_k(["7", "12", "12", "7"], "7", 4) == 0.5
    # None never votes, even when it is the most common
    assert maj_at_k([None, None, "5"], "5", 3) == 1.0
    assert maj_at_k([None, None], "5", 2) == 0.0
    # normalised answers vote together: "1,000" and "1000.0" beat "7"
    assert maj_at_k(["7", "1,000", "1000.0"], "1000", 3) == 1.0
    assert mean_maj_at_k([(["1", "1", "2"], "1"), (["3", "4", "4"], "3")], 3) == 0.5
    with pytest.raises(ValueError):
        maj_at_k(["1"], "1", 0)


def test_sequence_kl_sums_log_ratios_over_response_tokens_only():
    from rlft.eval.evaluate import sequence_kl

    logp = torch.tensor([[-1.0, -2.0, -0.5], [-0.1, float("nan"), -3.0]])
    ref = torch.tensor([[-1.5, -1.0, -9.0], [-0.4, -1.0, float("inf")]])
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 0.0, 0.0]])
    assert sequence_kl(logp, ref, mask).tolist() == pytest.approx([0.5 - 1.0, 0.3])


def test_sequence_kl_estimates_the_exact_kl_on_samples_from_the_policy():
    """Mean of the k1 sequence estimate on samples from pi -> KL(pi || ref) (one-token responses)."""
    from rlft.eval.evaluate import sequence_kl

    pi, ref = torch.tensor([0.7, 0.2, 0.1]), torch.tensor([0.3, 0.3, 0.4])
    exact = float((pi * (pi / ref).log()).sum())
    g = torch.Generator().manual_seed(0)
    y = torch.multinomial(pi, 200_000, replacement=True, generator=g)
    est = sequence_kl(pi.log()[y][:, None], ref.log()[y][:, None], torch.ones(len(y), 1)).mean()
    assert float(est) == pytest.approx(exact, abs=0.01)


def test_comparison_table_orders_rows_and_picks_the_largest_k(tmp_path):
    import json

    from rlft.eval.compare import write_comparison

    for name, acc in (("sft", 0.25), ("grpo", 0.5)):
        (tmp_path / name).mkdir()
        metrics = {"greedy_accuracy": acc, "pass@1": 0.2, "pass@4": 0.6, "maj@4": 0.3, "reward": acc,
                   "reward/correctness": acc, "kl_to_ref": 1.5, "num_problems": 10}
        (tmp_path / name / "eval.json").write_text(json.dumps({"metrics": metrics}))
    table = write_comparison(tmp_path, ["sft"]).splitlines()
    assert table[0] == ("| model | greedy_accuracy | maj@4 | pass@4 | pass@1 | reward | kl_to_ref "
                        "| reward/correctness |")
    assert table[2].startswith("| sft | 0.250 |") and table[3].startswith("| grpo | 0.500 |")
    assert (tmp_path / "comparison.csv").read_text().splitlines()[1].startswith("sft,0.250,")
