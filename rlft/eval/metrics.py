"""Sampling-based evaluation metrics (docs/algorithms.md §11).

    pass_at_k       unbiased pass@k of Chen et al. 2021 (human-eval), one problem
    mean_pass_at_k  its average over problems
    maj_at_k        majority vote over the first k extracted answers, one problem
    mean_maj_at_k   its average over problems

Answers given to maj@k are compared after `normalize_answer`, so "1,000",
"1000" and "1000.0" vote together.
"""

from __future__ import annotations

from collections import Counter
from typing import Iterable, Sequence

from rlft.rewards.verifiers import answers_match, normalize_answer


def pass_at_k(n: int, c: int, k: int) -> float:
    """1 - C(n-c, k) / C(n, k) = 1 - prod_{i=n-c+1}^{n} (1 - k/i); 1 if n - c < k.

    n samples of which c are correct; requires 0 <= c <= n and 1 <= k <= n.
    The product form avoids huge binomials (Codex uses n = 200). Never use
    1 - (1 - c/n)^k, which is biased.
    """
    if not (0 <= c <= n and 1 <= k <= n):
        raise ValueError(f"pass@k needs 0 <= c <= n and 1 <= k <= n, got n={n}, c={c}, k={k}")
    if n - c < k:
        return 1.0
    prod = 1.0
    for i in range(n - c + 1, n + 1):
        prod *= 1.0 - k / i
    return 1.0 - prod


def mean_pass_at_k(counts: Iterable[tuple[int, int]], k: int) -> float:
    """Mean of pass_at_k(n, c, k) over problems given as (n, c) pairs."""
    values = [pass_at_k(n, c, k) for n, c in counts]
    if not values:
        raise ValueError("mean_pass_at_k needs at least one problem")
    return sum(values) / len(values)


def majority_answer(answers: Sequence[str | None], k: int) -> str | None:
    """Most frequent normalised answer among the first k; ties go to the answer
    seen first; None (no extractable answer) never votes. None if no answer."""
    if k < 1:
        raise ValueError(f"maj@k needs k >= 1, got {k}")
    normed = [normalize_answer(a) for a in answers[:k]]
    votes = Counter(a for a in normed if a is not None)
    if not votes:
        return None
    best = max(votes.values())
    return next(a for a in normed if a is not None and votes[a] == best)


def maj_at_k(answers: Sequence[str | None], gold: str, k: int) -> float:
    """1.0 if the majority answer of the first k samples matches gold, else 0.0."""
    return float(answers_match(majority_answer(answers, k), gold))


def mean_maj_at_k(problems: Iterable[tuple[Sequence[str | None], str]], k: int) -> float:
    """Mean of maj_at_k over problems given as (answers, gold) pairs."""
    values = [maj_at_k(answers, gold, k) for answers, gold in problems]
    if not values:
        raise ValueError("mean_maj_at_k needs at least one problem")
    return sum(values) / len(values)
