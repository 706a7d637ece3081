"""Reward-model labels for a policy's own samples (docs/algorithms.md §2).

    outcome_pairs      (correct, incorrect) completions of one prompt, by the answer verifier
    exact_step_labels  built-in task: a step is good while every step so far equals the gold one
    mc_step_labels     Math-Shepherd: a step is good when a continuation of its prefix reaches the
                       gold answer (hard estimate), from the completions' outcomes

A record is one sampled completion: {prompt_text, completion, correct} (+ its row). Steps are the completion's non-empty lines, the final `#### n` line included.
"""
from __future__ import annotations

import torch

from typing import Callable

from rlft.algos.preference import math_shepherd_labels
from rlft.rewards.verifiers import extract_answer


def outcome_pairs(records: list[dict], group_size: int) -> list[dict]:
    """{prompt_text, chosen, rejected}: within each group of `group_size` completions to one prompt,
    its correct completions paired in order with its incorrect ones."""
    pairs = []
    for g in range(0, len(records), group_size):
        group = records[g:g + group_size]
        good = [r for r in group if r["correct"]]
        bad = [r for r in group if not r["correct"]]
        for w, lose in zip(good, bad):
            pairs.append({"prompt_text": w["prompt_text"], "chosen": w["completion"], "rejected": lose["completion"]})
    return pairs


def _same_step(line: str, gold: str) -> bool:
    return "".join(line.split()) == "".join(gold.split())


def worked_steps(response: str) -> list[str]:
    """The reasoning lines of a built-in task's worked solution (its answer line `#### n` left out)."""
    return [line for line in str(response).split("\n") if line.strip() and not line.lstrip().startswith("####")]


def exact_step_labels(steps: list[str], gold_steps: list[str], solves: Callable[[str], bool]) -> list[int]:
    """Hard labels checked against the worked solution: reasoning line j is 1 while lines 0..j all equal
    the gold lines (from a wrong intermediate value no continuation reaches the gold answer on this
    task); an answer line (`#### n`) is 1 when `solves(line)` (the environment's answer check)."""
    labels, on_track = [], True
    for j, line in enumerate(steps):
        if line.lstrip().startswith("####") and extract_answer(line) is not None:
            labels.append(int(solves(line)))
            continue
        on_track = on_track and j < len(gold_steps) and _same_step(line, gold_steps[j])
        labels.append(int(on_track))
    return labels


def mc_step_labels(continuations: list[list[str]], prefixes: list[str],
                   solves: Callable[[str], bool]) -> tuple[list[int], list[float]]:
    """(hard, soft) labels per step from the completer's continuations of each step's prefix:
    hard = some continuation reaches the gold answer (`solves(prefix + continuation)`: the
    environment's check), soft = the share that does."""
    n = len(continuations[0]) if continuations else 1
    reaching = [sum(bool(solves(prefix + text)) for text in texts)
                for prefix, texts in zip(prefixes, continuations)]
    hard, soft = math_shepherd_labels(torch.tensor(reaching), n)
    return [int(x) for x in hard.tolist()], [float(x) for x in soft.tolist()]


def step_prefixes(steps: list[str]) -> list[str]:
    """The completion up to and including step j, for each j (what a completer continues from)."""
    return ["\n".join(steps[:j + 1]) + "\n" for j in range(len(steps))]
