"""User reward functions for the RL tests (the `package.module:function` reward source).

The tests put tests/data on sys.path (PYTHONPATH for CLI subprocesses), so the import path
is `rl_user_reward:<function>`. Signature: fn(prompts, completions, **row_fields) -> list[float].
"""
from __future__ import annotations


def always_one(prompts, completions, **row_fields):
    """1.0 for every completion (offline RFT keeps every finished sample)."""
    return [1.0] * len(completions)


def alternate(prompts, completions, **row_fields):
    """1, 0, 1, 0, ... by position: every group of an even size G has a non-zero reward std."""
    return [float(i % 2 == 0) for i in range(len(completions))]


def answer_length(prompts, completions, answer, **row_fields):
    """len(gold answer field) + len(completion): proves that row fields reach the function."""
    return [float(len(a) + len(c)) for a, c in zip(answer, completions)]


def wrong_count(prompts, completions, **row_fields):
    """One value too few (RewardSet must refuse it)."""
    return [0.0] * (len(completions) - 1)


NOT_A_FUNCTION = 3


def half_flat(prompts, completions, **row_fields):
    """All 0.0 for prompts whose character sum is even (a zero-std group), else 1, 0, 1, 0, ..."""
    return [0.0 if sum(map(ord, p)) % 2 == 0 else float(i % 2 == 0) for i, p in enumerate(prompts)]


def by_prompt(prompts, completions, **row_fields):
    """By the prompt's character sum mod 3: always 1 (a solved prompt), always 0 (an unsolved one), or 1, 0, 1, 0,
    ... (a prompt whose group teaches): the difficulty pool's three kinds, whatever the policy writes."""
    kinds = [sum(map(ord, p)) % 3 for p in prompts]
    return [1.0 if k == 0 else 0.0 if k == 1 else float(i % 2 == 0) for i, k in enumerate(kinds)]


def share_of_sevens(prompts, completions, **row_fields):
    """Share of the characters that are '7': a signal a random policy can learn in a few steps."""
    return [c.count("7") / max(len(c), 1) for c in completions]


def nan_for_the_second(prompts, completions, **row_fields):
    """NaN at sample 1 (the contract: one finite number per completion)."""
    return [float("nan") if i == 1 else 1.0 for i in range(len(completions))]


def strings(prompts, completions, **row_fields):
    return ["1.0"] * len(completions)


def nothing(prompts, completions, **row_fields):
    return None


def a_scalar(prompts, completions, **row_fields):
    return 1.0


def raises(prompts, completions, **row_fields):
    raise KeyError("score")


def slow(prompts, completions, **row_fields):
    """Takes 2 s per call (a slow judge)."""
    import time

    time.sleep(2.0)
    return [0.0] * len(completions)


CALLS = {"batches": 0}


def fails_in_the_second_rollout(prompts, completions, **row_fields):
    """Alternating rewards for the first batch of completions, an exception from the second batch on (the
    single-row call before the run starts does not count)."""
    if len(completions) > 1:
        CALLS["batches"] += 1
        if CALLS["batches"] >= 2:
            raise ZeroDivisionError("division by zero")
    return [float(i % 2 == 0) for i in range(len(completions))]


_CALLS = {"n": 0}


def fails_on_third_call(prompts, completions, **row_fields):
    """Scores like `alternate` twice in a process (the check before the run, the first rollout), then raises: a
    user function that breaks after the trainer has started."""
    _CALLS["n"] += 1
    if _CALLS["n"] >= 3:
        raise ValueError("the judge service went away")
    return alternate(prompts, completions)


def fails_on_rank_1(prompts, completions, **row_fields):
    """Raises on the second rank only (from its second call on): a user error that one rank meets alone."""
    import os

    _CALLS["n"] += 1
    if os.environ.get("RANK") == "1" and _CALLS["n"] >= 2:
        raise ValueError("the judge service went away")
    return alternate(prompts, completions)
