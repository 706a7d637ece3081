"""The learning-rate schedule and the deterministic data order (pure functions, no process group).

lr(step) / train.lr for optimizer step `step` (0-based), from transformers' warmup-stable-decay
schedule as rlft configures it (make_scheduler): linear warm-up from min_ratio to 1 over `warmup`
steps, then decay from 1 to min_ratio over the remaining total-warmup steps (or constant 1).
Worked values (warmup=4, total=14, min_ratio=0.1):
    warm-up   steps 0..3 -> 0.1 + 0.9 * step / 4 = 0.1, 0.325, 0.55, 0.775
    progress  p = (step - 4) / 10, so step 9 -> p=0.5, step 14 -> p=1
    cosine    0.1 + 0.9 * 0.5 * (1 + cos(pi p)): step 4 -> 1.0, step 9 -> 0.55, step 14 -> 0.1
    linear    1 - 0.9 p:                           step 4 -> 1.0, step 9 -> 0.55, step 11 -> 0.37
    constant  1.0 after warm-up
"""
from __future__ import annotations

import math
from types import SimpleNamespace

import pytest
import torch

from rlft.trainer import last_step_lr, make_scheduler
from rlft.microbatch import fixed
from rlft.stages.common import rank_share, step_indices

W, T, M = 4, 14, 0.1


def lr_multiplier(step: int, warmup: int, total: int, schedule: str, min_ratio: float) -> float:
    """The factor on train.lr at optimizer step `step`, read from the scheduler the engine builds."""
    opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=1.0)
    sched = make_scheduler(opt, SimpleNamespace(warmup_steps=warmup, max_steps=total, lr_schedule=schedule,
                                                min_lr_ratio=min_ratio))
    return sched.lr_lambdas[0](step)


@pytest.mark.parametrize("schedule", ["cosine", "linear", "constant"])
def test_warmup_is_linear_from_the_min_ratio(schedule):
    assert [lr_multiplier(s, W, T, schedule, M) for s in range(W)] == pytest.approx([0.1, 0.325, 0.55, 0.775])


def test_cosine_values():
    got = [lr_multiplier(s, W, T, "cosine", M) for s in (4, 6, 9, 12, 14, 20)]
    # step 6: p=0.2, 0.1 + 0.45 * (1 + cos(0.2 pi)) = 0.1 + 0.45 * 1.809017 = 0.914058
    # step 12: p=0.8, 0.1 + 0.45 * (1 + cos(0.8 pi)) = 0.1 + 0.45 * 0.190983 = 0.185942
    assert got == pytest.approx([1.0, 0.914058, 0.55, 0.185942, 0.1, 0.1], abs=1e-6)


def test_linear_values():
    got = [lr_multiplier(s, W, T, "linear", M) for s in (4, 9, 11, 14, 30)]
    assert got == pytest.approx([1.0, 0.55, 0.37, 0.1, 0.1], abs=1e-12)


def test_constant_values():
    assert [lr_multiplier(s, W, T, "constant", M) for s in (4, 9, 13)] == [1.0, 1.0, 1.0]


def test_no_warmup_starts_at_full_rate():
    assert lr_multiplier(0, 0, 10, "cosine", 0.0) == 1.0
    assert lr_multiplier(5, 0, 10, "cosine", 0.0) == pytest.approx(0.5)
    assert lr_multiplier(5, 0, 10, "linear", 0.0) == pytest.approx(0.5)
    assert lr_multiplier(10, 0, 10, "linear", 0.0) == 0.0


def test_cosine_is_monotone_and_bounded():
    values = [lr_multiplier(s, W, T, "cosine", M) for s in range(W, T + 3)]
    assert all(a >= b for a, b in zip(values, values[1:]))
    assert min(values) == pytest.approx(M) and max(values) == 1.0


def test_warmup_longer_than_training_does_not_divide_by_zero():
    assert lr_multiplier(3, 10, 5, "cosine", 0.1) == pytest.approx(0.1 + 0.9 * 3 / 5)
    assert math.isfinite(lr_multiplier(10, 10, 10, "cosine", 0.1))


# ----------------------------------------------------------------------------- data order
def test_step_indices_are_deterministic():
    a = [step_indices(s, 8, 50, seed=3) for s in range(20)]
    b = [step_indices(s, 8, 50, seed=3) for s in reversed(range(20))][::-1]  # any call order
    assert a == b
    assert a != [step_indices(s, 8, 50, seed=4) for s in range(20)]


@pytest.mark.parametrize("batch,n", [(8, 40), (8, 50), (7, 10), (32, 10)])
def test_step_indices_cover_each_epoch_exactly_once(batch, n):
    epochs = 3
    steps = -(-epochs * n // batch)  # ceil
    flat = [i for s in range(steps) for i in step_indices(s, batch, n, seed=11)]
    assert len(flat) == steps * batch
    for e in range(epochs):
        assert sorted(flat[e * n:(e + 1) * n]) == list(range(n)), f"epoch {e}"
    first, second = flat[:n], flat[n:2 * n]
    assert first != second, "each epoch is reshuffled"


def test_step_indices_shuffle_is_not_identity():
    flat = [i for s in range(5) for i in step_indices(s, 10, 50, seed=0)]
    assert flat != list(range(50))


def rank_micro_batches(indices, rank, world, micro):
    share = rank_share(indices, rank, world)
    return [[share[j] for j in group] for group in fixed(len(share), micro)]


@pytest.mark.parametrize("world,micro", [(1, 2), (1, 8), (2, 2), (2, 4), (4, 1), (4, 2)])
def test_rank_micro_batches_partition_the_global_batch(world, micro):
    indices = step_indices(1, 8, 23, seed=1)  # positions 8..15: inside epoch 0, so no repeats
    assert len(set(indices)) == 8
    shares = [rank_micro_batches(indices, r, world, micro) for r in range(world)]
    flat = [i for share in shares for mb in share for i in mb]
    assert flat == indices  # disjoint, complete, in order: rank r holds the r-th contiguous slice
    for share in shares:
        assert all(len(mb) == micro for mb in share)
        assert len(share) == 8 // (world * micro)  # gradient-accumulation steps
    per_rank = [set(i for mb in share for i in mb) for share in shares]
    for r in range(world):
        for q in range(r + 1, world):
            assert not per_rank[r] & per_rank[q]


def test_rank_micro_batches_positions_not_values():
    """Duplicate example ids (batch larger than the data) are still split by position."""
    indices = [3, 3, 1, 1, 0, 2, 2, 0]
    assert rank_micro_batches(indices, 0, 2, 2) == [[3, 3], [1, 1]]
    assert rank_micro_batches(indices, 1, 2, 2) == [[0, 2], [2, 0]]


@pytest.mark.parametrize("schedule", ["cosine", "constant"])
def test_the_logged_rate_is_the_one_the_last_step_used(schedule):
    opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=2.0)
    sched = make_scheduler(opt, SimpleNamespace(warmup_steps=W, max_steps=T, lr_schedule=schedule, min_lr_ratio=M))
    used = []
    for _ in range(T):
        used.append(opt.param_groups[0]["lr"])
        opt.step()
        sched.step()
        assert last_step_lr(sched) == pytest.approx(used[-1])
    assert used[-1] == pytest.approx(2.0 if schedule == "constant" else 2.0 * lr_multiplier(T - 1, W, T, schedule, M))
