"""The synthetic arithmetic task: correct worked solutions, disjoint splits, consistent corruptions."""

import random
import subprocess
import sys
from pathlib import Path

import pytest

from rlft.data.formatting import DEFAULT_TEMPLATE
from rlft.data.synthetic import (
    TaskSpec,
    apply_op,
    corrupt_steps,
    make_problem,
    make_splits,
    parse_step,
    preference_rows,
    solution_text,
    step_label_rows,
)

SMALL = TaskSpec(min_ops=1, max_ops=3, max_operand=30, num_train=300, num_test=60, seed=3)


def check_chain(steps: list[str]) -> list[bool]:
    """For each step: is its result the true value of its left-hand side? Also checks chaining."""
    ok, previous = [], None
    for step in steps:
        value, op, operand = parse_step(step)
        result = int(step.split("=")[1])
        assert previous is None or value == previous, "each step starts from the previous result"
        assert result >= 0
        ok.append(apply_op(value, op, operand) == result)
        previous = result
    return ok


@pytest.fixture(scope="module")
def splits():
    return make_splits(SMALL)


def test_problem_is_correct_and_gsm8k_formatted():
    rng = random.Random(0)
    for _ in range(50):
        p = make_problem(rng, TaskSpec(operations="+-*"))
        assert all(check_chain(p["steps"]))
        assert p["final"] == p["steps"][-1].split("=")[1]
        assert p["answer"] == "\n".join(p["steps"]) + f"\n#### {p['final']}"
        assert p["question"].endswith("have?")
        # every operand is stated in the question
        for step in p["steps"]:
            _, _, operand = parse_step(step)
            assert str(operand) in p["question"]


def test_example_matches_spec_shape():
    p = make_problem(random.Random(1), TaskSpec(min_ops=2, max_ops=2))
    assert len(p["steps"]) == 2
    assert p["question"].count("Then ") == 1


def test_default_sequences_are_short():
    train, _ = make_splits(TaskSpec(num_train=2000, num_test=10))
    longest = max(len(DEFAULT_TEMPLATE.format(question=r["question"]) + r["answer"]) for r in train)
    assert longest < 140


def test_splits_are_deterministic_and_disjoint(splits):
    train, test = splits
    assert len(train) == 300 and len(test) == 60
    assert make_splits(SMALL) == (train, test)
    assert not {r["question"] for r in train} & {r["question"] for r in test}
    assert len({r["question"] for r in train}) == 300
    other_train, _ = make_splits(TaskSpec(num_train=300, num_test=60, seed=4))
    assert other_train != train


def test_too_small_task_raises():
    spec = TaskSpec(min_ops=1, max_ops=1, max_operand=2, num_names=1, num_items=1, num_templates=1,
                    operations="+", num_train=100, num_test=10)
    with pytest.raises(ValueError, match="too small"):
        make_splits(spec)


@pytest.mark.parametrize("bad", [dict(operations="+/"), dict(min_ops=3, max_ops=2), dict(num_names=99)])
def test_spec_validation(bad):
    with pytest.raises(ValueError):
        TaskSpec(**bad)


def test_corruption_is_one_slip_carried_forward(splits):
    train, _ = splits
    rng = random.Random(0)
    firsts = set()
    for p in train[:100]:
        steps, first = corrupt_steps(p, rng)
        firsts.add(first)
        assert len(steps) == len(p["steps"])
        assert steps[:first] == p["steps"][:first]
        ok = check_chain(steps)
        assert ok == [i != first for i in range(len(steps))]
        assert steps[-1].split("=")[1] != p["final"]
    assert firsts == {0, 1, 2}


def test_preference_rows(splits):
    train, _ = splits
    rows = preference_rows(train[:20], seed=0)
    assert rows == preference_rows(train[:20], seed=0)
    for row, p in zip(rows, train):
        # chosen is the correct solution even where the demonstration slipped
        assert row["question"] == p["question"] and row["chosen"] == solution_text(p["steps"], p["final"])
        *lines, last = row["rejected"].split("\n")
        assert last == "#### " + lines[-1].split("=")[1]
        assert last != f"#### {p['final']}"


def test_step_labels_follow_hard_estimate(splits):
    train, _ = splits
    rows = step_label_rows(train[:80], seed=1, frac_correct=0.5)
    n_correct = 0
    for row, p in zip(rows, train):
        *lines, final = row["steps"]
        assert len(row["labels"]) == len(row["steps"])
        assert final == "#### " + lines[-1].split("=")[1]
        ok = check_chain(lines)
        expected = [int(all(ok[: i + 1])) for i in range(len(lines))]
        assert row["labels"] == expected + [expected[-1]]
        n_correct += all(row["labels"])
        assert all(row["labels"]) == (final == f"#### {p['final']}")
    assert 20 < n_correct < 60


def test_step_label_fractions(splits):
    train, _ = splits
    assert all(all(r["labels"]) for r in step_label_rows(train[:30], seed=0, frac_correct=1.0))
    assert not any(all(r["labels"]) for r in step_label_rows(train[:30], seed=0, frac_correct=0.0))


def test_task_and_loading_modules_import_without_torch():
    """The config schema imports TaskSpec; that must not pull in torch or transformers."""
    code = (
        "import sys, rlft.data.synthetic, rlft.data.loading, rlft.data.formatting; "
        "print(sorted(m for m in ('torch', 'transformers') if m in sys.modules))"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                          cwd=Path(__file__).resolve().parents[2])
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "[]"


def test_sloppy_solver_drops_carries_and_borrows():
    from rlft.data.synthetic import sloppy_result

    assert sloppy_result(17, "+", 25) == 32   # 7+5=12 -> 2, 1+2 -> 3
    assert sloppy_result(42, "-", 17) == 35   # |2-7|=5, 4-1=3
    assert sloppy_result(13, "+", 5) == 18    # no carry: unchanged
    assert sloppy_result(6, "*", 3) == 18     # multiplication is done right


def test_demo_slip_rate_changes_training_demonstrations_only():
    from rlft.data.synthetic import TaskSpec, make_splits, preference_rows

    clean_train, clean_test = make_splits(TaskSpec(num_train=400, num_test=50))
    train, test = make_splits(TaskSpec(num_train=400, num_test=50, demo_slip_rate=1.0))
    assert test == clean_test
    assert [r["final"] for r in train] == [r["final"] for r in clean_train]  # gold answers stay correct
    slipped = [r for r in train if not r["answer"].endswith(f"#### {r['final']}")]
    assert 0.2 * len(train) < len(slipped) < len(train)  # only problems with a carry or borrow change
    for row in preference_rows(train, seed=0):
        assert row["chosen"].endswith("#### " + next(r["final"] for r in train if r["question"] == row["question"]))
