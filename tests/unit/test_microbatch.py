"""Micro-batches by a token budget (rlft.microbatch, train.max_tokens_per_micro_batch): the grouping
itself, and that the RL updates (policy and pairwise) do not change when their forwards are cut by
tokens instead of by a fixed number of rows."""
import copy
import random

import pytest
import torch

from rlft import microbatch
from rlft.algos import pair_rollout_inputs
from rlft.stages import update as up
from rlft.stages.common import Sums, example_sequences
from test_p3o_invariance import SCORES, algo, rollout, setup  # noqa: F401  (the module fixture)
from test_rl_parts import one_rank  # noqa: F401  (a world-size-1 process group)


def test_forward_tokens_counts_what_the_forward_computes():
    items = [[5], [3, 7], [2]]
    assert microbatch.forward_tokens(items, packed=True) == 17
    assert microbatch.forward_tokens(items, packed=False) == 4 * 7  # 4 sequences padded to the longest
    assert microbatch.forward_tokens([], packed=True) == 0


@pytest.mark.parametrize("packed", [True, False])
@pytest.mark.parametrize("budget", [1, 40, 100, 10_000])
def test_by_tokens_partitions_within_the_budget(packed, budget):
    rng = random.Random(budget)
    items = [[rng.randint(5, 60)] if rng.random() < 0.7 else [rng.randint(5, 60), rng.randint(5, 60)]
             for _ in range(37)]
    groups = microbatch.by_tokens(items, budget, packed)
    assert sorted(i for g in groups for i in g) == list(range(len(items)))  # every item once
    for g in groups:
        assert g == sorted(g)
        cost = microbatch.forward_tokens([items[i] for i in g], packed)
        assert cost <= budget or len(g) == 1  # only an item over the budget alone may exceed it
    assert groups == sorted(groups) == microbatch.by_tokens(items, budget, packed)  # deterministic
    if budget == 10_000:
        assert len(groups) == 1
    if budget == 1:
        assert len(groups) == len(items)


def test_by_tokens_packs_better_than_consecutive_cuts():
    """Longest first: a long item does not strand short ones; with padding, like lengths share a forward."""
    items = [[90], [10], [90], [10], [90], [10]]
    assert len(microbatch.by_tokens(items, 100, packed=True)) == 3
    padded = microbatch.by_tokens(items, 200, packed=False)
    assert [[items[i][0] for i in g] for g in padded] == [[90, 90], [10, 90], [10, 10]]


def test_split_to_reaches_the_count_and_keeps_the_items():
    groups = [[0, 1, 2, 3, 4], [5], [6, 7]]
    out = microbatch.split_to(groups, 5)
    assert len(out) == 5
    assert sorted(i for g in out for i in g) == list(range(8))
    assert microbatch.split_to(groups, 3) == groups
    with pytest.raises(ValueError, match="cannot cut 8 items into 9"):
        microbatch.split_to(groups, 9)


def test_plan_without_a_budget_is_the_fixed_micro_batch(one_rank):  # noqa: F811
    items = [[3]] * 10
    assert microbatch.plan(items, 4, 0, packed=True) == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9]]
    assert microbatch.plan(items, 4, 7, packed=True) == [[0, 1], [2, 3], [4, 5], [6, 7], [8, 9]]


def test_example_sequences_of_each_stage():
    assert example_sequences({"input_ids": [1, 2, 3], "loss_mask": [0, 1, 1]}) == [3]
    assert example_sequences({"chosen_ids": [1, 2], "rejected_ids": [1, 2, 3, 4]}) == [2, 4]


def test_rollout_groups_keep_pairs_together(one_rank):  # noqa: F811
    attn = torch.zeros(8, 30, dtype=torch.long)
    for row, n in enumerate([30, 5, 6, 25, 8, 9, 12, 11]):
        attn[row, :n] = 1
    groups = microbatch.rollout_groups(attn, 0, 8, 8, max_tokens=40, packed=True, unit=2)
    assert len(groups) > 1
    assert sorted(int(r) for g in groups for r in g) == list(range(8))
    for g in groups:
        rows = g.tolist()
        assert all(rows[k] % 2 == 0 and rows[k + 1] == rows[k] + 1 for k in range(0, len(rows), 2))
    offset = microbatch.rollout_groups(attn[2:6], 0, 4, 2)  # a minibatch's rows, fixed size
    assert [g.tolist() for g in offset] == [[0, 1], [2, 3]]
    assert [g.tolist() for g in microbatch.rollout_groups(attn, 2, 4, 2)] == [[2, 3], [4, 5]]


class AccumulatingSGD:
    """The slice of rlft.trainer.Trainer the updates use: gradients accumulate over micro-batches and the
    SGD step happens at the micro-batch marked `last`, as DeepSpeed does at its accumulation boundary."""

    def __init__(self, model):
        self.module, self.device = model, torch.device("cpu")
        self.opt = torch.optim.SGD(model.parameters(), lr=0.5)
        self.last = False
        self.forwards = 0

    def __call__(self, **kwargs):
        self.forwards += 1
        return self.module(**kwargs)

    def backward(self, loss, last):
        loss.backward()
        self.last = last

    def step(self):
        if self.last:
            self.opt.step()
            self.opt.zero_grad()


def updated(base_model, tok, update, **kw):
    model = copy.deepcopy(base_model)
    engine = AccumulatingSGD(model)
    ro = rollout(tok, model, SCORES)
    update(engine, ro, algo(pairwise_loss="p3o_joint"), **kw)
    return torch.cat([p.detach().flatten() for p in model.parameters()]), engine.forwards


def pairwise(engine, ro, a, **kw):
    scores, s_ref, delta = pair_rollout_inputs(ro.scores, ro.get("old_logp"), ro.get("ref_logp"), ro.mask, 2, a.kl_coef)
    ro.put(pair_scores=scores, pair_s_ref=s_ref, delta=delta)
    up.update_pairwise(engine, ro, Sums(), up.Shape(a, 2, 1.0, 16, 4, **kw), a, a.kl_coef)


def policy(engine, ro, a, **kw):
    ro.put(adv=torch.linspace(-1, 1, ro.mask.numel()).reshape(ro.mask.shape) * ro.mask)
    up.update_policy(engine, ro, Sums(), up.Shape(a, 2, 1.0, 16, 4, **kw), a.kl_coef)


@pytest.mark.parametrize("update", [pairwise, policy])
@pytest.mark.parametrize("packed", [False, True])
def test_rl_updates_do_not_depend_on_the_token_budget(one_rank, setup, update, packed):  # noqa: F811
    tok, model = setup
    start = torch.cat([p.detach().flatten() for p in model.parameters()])
    whole, n_whole = updated(model, tok, update, packed=packed)
    cut, n_cut = updated(model, tok, update, packed=packed, max_tokens=20)
    assert n_whole == 1 and n_cut > 1  # the budget really cut the step into several forwards
    assert (whole - start).abs().max() > 1e-4
    assert torch.allclose(whole, cut, atol=1e-6, rtol=0)
