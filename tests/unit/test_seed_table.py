"""The equal-budget table's aggregation over seeds (rlft.eval.compare.seed_table)."""
import pytest

from rlft.eval.compare import mean_std, seed_table


def record(acc: float, reward: float = 0.2) -> dict:
    return {"metrics": {"greedy_accuracy": acc, "maj@8": acc, "pass@8": 0.5, "pass@1": acc, "reward": reward,
                        "kl_to_ref": 0.1}}


def test_mean_and_sample_std():
    assert mean_std([0.2]) == (0.2, 0.0)
    mean, std = mean_std([0.1, 0.2, 0.3])
    assert mean == pytest.approx(0.2) and std == pytest.approx(0.1)


def test_rows_are_mean_std_over_seeds_with_the_gain_over_the_baseline():
    records = {"sft": record(0.20), "grpo-s0": record(0.26), "grpo-s1": record(0.28), "grpo-s2": record(0.24),
               "ppo-s0": record(0.21), "ppo-s1": record(0.19)}
    seen = {"grpo-s0": 6144, "grpo-s1": 6144, "grpo-s2": 6144, "ppo-s0": 6144, "ppo-s1": 6144}
    header, lines = seed_table(records, seen, ["grpo", "ppo", "dpo"], [0, 1, 2], "sft")
    assert header[:4] == ["model", "seeds", "greedy_accuracy", "maj@8"]
    assert [line[0] for line in lines] == ["sft", "grpo", "ppo"]  # dpo: no record, no line
    grpo = dict(zip(header, lines[1]))
    assert grpo["seeds"] == "3" and grpo["greedy_accuracy"] == "0.260 ± 0.020"
    assert grpo["gain (greedy)"] == "+6.0 ± 2.0 pts" and grpo["≥ +5 pts"] == "yes"
    assert grpo["samples seen"] == "6,144"
    ppo = dict(zip(header, lines[2]))
    assert ppo["seeds"] == "2" and ppo["≥ +5 pts"] == "no" and ppo["gain (greedy)"] == "+0.0 ± 1.4 pts"


def test_unequal_budgets_show_in_the_samples_column():
    records = {"sft": record(0.2), "grpo-s0": record(0.3), "grpo-s1": record(0.3)}
    _, lines = seed_table(records, {"grpo-s0": 6144, "grpo-s1": 6400}, ["grpo"], [0, 1], "sft")
    assert lines[1][-1] == "6,144/6,400"
