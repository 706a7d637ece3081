"""Sampling-based evaluation metrics (docs/algorithms.md §11).

    pass_at_k       unbiased pass@k of Chen et al. 2021 (human-eval), one problem
    mean_pass_at_k  its average over problems
    maj_at_k_votes  the same for answers an environment judged (canonical keys, the set that is correct)
    maj_at_k        expected majority-vote correctness of k answers drawn without replacement from the
                    n samples (like pass@k, an estimate over all n, not over the first k), one problem
    mean_maj_at_k   its average over problems

Answers given to maj@k are compared after `normalize_answer`, so "1,000",
"1000" and "1000.0" vote together.
"""

from __future__ import annotations

import itertools
import math
import random
from collections import Counter
from typing import Collection, Hashable, Iterable, Sequence

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


MAJ_SUBSETS = 2000  # k-subsets enumerated exactly up to this many, else this many drawn (seeded)


def _vote_credit(normed: Sequence[Hashable | None], correct: Collection) -> float:
    """Majority vote of one subset: 1 when a correct answer is the single most frequent answer, 1/t when
    it is one of t tied answers (a fair tie-break), 0 otherwise; None never votes."""
    votes = Counter(a for a in normed if a is not None)
    if not votes:
        return 0.0
    best = max(votes.values())
    top = [a for a, v in votes.items() if v == best]
    return sum(a in correct for a in top) / len(top)


def maj_at_k_votes(keys: Sequence[Hashable | None], correct: Collection, k: int, seed: int = 0) -> float:
    """E[the majority vote of k of the n answers is correct], over k-subsets drawn uniformly without
    replacement: exact when C(n, k) <= MAJ_SUBSETS, else the mean over MAJ_SUBSETS seeded draws.
    `keys` are the answers in canonical form (None: no answer), `correct` the keys that are right.
    maj@1 equals pass@1 (c/n); maj@n is the vote of all n samples."""
    n = len(keys)
    if not 1 <= k <= n:
        raise ValueError(f"maj@k needs 1 <= k <= n, got k={k}, n={n}")
    if math.comb(n, k) <= MAJ_SUBSETS:
        subsets = itertools.combinations(range(n), k)
        total, count = 0.0, 0
        for idx in subsets:
            total += _vote_credit([keys[i] for i in idx], correct)
            count += 1
        return total / count
    rng = random.Random(seed)
    return sum(_vote_credit([keys[i] for i in rng.sample(range(n), k)], correct)
               for _ in range(MAJ_SUBSETS)) / MAJ_SUBSETS


def maj_at_k(answers: Sequence[str | None], gold: str, k: int, seed: int = 0) -> float:
    """maj@k of raw numeric or text answers against `gold`, compared after `normalize_answer`."""
    normed = [normalize_answer(a) for a in answers]
    return maj_at_k_votes(normed, {a for a in normed if a is not None and answers_match(a, gold)}, k, seed)


def mean_maj_at_k(problems: Iterable[tuple[Sequence[str | None], str]], k: int) -> float:
    """Mean of maj_at_k over problems given as (answers, gold) pairs."""
    values = [maj_at_k(answers, gold, k) for answers, gold in problems]
    if not values:
        raise ValueError("mean_maj_at_k needs at least one problem")
    return sum(values) / len(values)
