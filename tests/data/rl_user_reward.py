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


def share_of_sevens(prompts, completions, **row_fields):
    """Share of the characters that are '7': a signal a random policy can learn in a few steps."""
    return [c.count("7") / max(len(c), 1) for c in completions]
