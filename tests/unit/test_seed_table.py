"""The equal-budget table's aggregation over seeds (rlft.eval.compare.seed_table)."""
import json

import pytest

from rlft.eval.compare import fixed_broken, mean_std, paired_cell, seed_table, sign_test_p


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


def test_fixed_broken_needs_the_same_problems_and_the_sign_test_is_one_sided():
    before = [("a", True), ("b", False), ("a", True)]
    assert fixed_broken(before, [("a", False), ("b", True), ("a", False)]) == (1, 2)
    with pytest.raises(ValueError, match="same problems"):
        fixed_broken(before, [("b", True), ("a", True), ("a", True)])
    assert sign_test_p(3, 0) == 0.125 and sign_test_p(1, 1) == 0.75 and sign_test_p(0, 0) == 1.0


def write_samples(folder, right: list[bool]) -> None:
    folder.mkdir(parents=True)
    (folder / "samples.jsonl").write_text("".join(
        json.dumps({"prompt": f"q{i}", "greedy": {"correct": r}}) + "\n" for i, r in enumerate(right)))


def test_paired_counts_sum_each_seed_against_its_own_start_and_join_the_table(tmp_path):
    for name, right in {"sft": [0, 0, 1, 1], "grpo-s0": [1, 1, 1, 0], "grpo-s1": [0, 1, 0, 1]}.items():
        write_samples(tmp_path / name, [bool(r) for r in right])
    pairs = [(tmp_path / "sft", tmp_path / f"grpo-s{s}") for s in (0, 1, 2)]  # seed 2 was not evaluated
    assert paired_cell(pairs) == "3 / 2 (p = 0.5)"  # seed 0: 2 fixed, 1 broken; seed 1: 1 fixed, 1 broken
    assert paired_cell([(tmp_path / "sft", tmp_path / "missing")]) == ""
    records = {"sft": record(0.5), "grpo-s0": record(0.75), "grpo-s1": record(0.5)}
    header, lines = seed_table(records, {}, ["grpo"], [0, 1], "sft", paired={"grpo": paired_cell(pairs)})
    assert header[-1] == "fixed / broken vs sft" and lines[1][-1] == "3 / 2 (p = 0.5)" and lines[0][-1] == ""
    assert len(seed_table(records, {}, ["grpo"], [0, 1], "sft")[0]) == len(header) - 1
