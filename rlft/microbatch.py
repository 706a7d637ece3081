"""How one rank cuts its share of a batch into forwards (micro-batches).

Two ways, chosen by the config:

- `train.micro_batch_per_device` items per forward (the default), consecutive;
- `train.max_tokens_per_micro_batch` tokens per forward: items grouped longest first into forwards of
  at most that many tokens (first-fit decreasing), so a step of short sequences takes few forwards and
  one of long sequences takes many, each of about the same size. A forward's tokens are what it
  computes: the sum of its sequences' lengths with `train.packing`, else sequences x the longest.

An item is what must stay in one forward: a sequence, or a preference pair (chosen and rejected), given
as the list of its sequences' lengths. The losses are normalised by counts of the whole optimizer step
(docs/algorithms.md), so the grouping changes the update only by floating-point summation order.

Under DeepSpeed every rank must run the same number of forwards (ZeRO-3 gathers each layer's
parameters collectively; ZeRO-1/2 reduce gradients at every backward), so `plan` takes the largest
count over ranks and the others split their biggest forwards until they match. A rank's item count
is the same on every rank, so that is always possible.
"""
from __future__ import annotations

from typing import Sequence

Item = Sequence[int]  # the token lengths of the sequences that share one forward


def forward_tokens(items: Sequence[Item], packed: bool) -> int:
    """Token positions one forward over `items` computes: the real tokens when packed, else the padded
    rectangle (sequences x the longest)."""
    lengths = [n for item in items for n in item]
    if not lengths:
        return 0
    return sum(lengths) if packed else len(lengths) * max(lengths)


def fixed(num_items: int, size: int) -> list[list[int]]:
    """Consecutive groups of `size` items (the last may be shorter)."""
    return [list(range(i, min(i + size, num_items))) for i in range(0, num_items, size)]


def by_tokens(items: Sequence[Item], max_tokens: int, packed: bool) -> list[list[int]]:
    """Item indices grouped into forwards of at most `max_tokens` tokens each (an item longer than the
    budget gets a forward of its own): first-fit over the items longest first. Groups come in the
    order of their first item, each in index order, so the result is deterministic."""
    order = sorted(range(len(items)), key=lambda i: (-sum(items[i]), i))
    groups: list[list[int]] = []
    for i in order:
        for group in groups:
            if forward_tokens([items[j] for j in group] + [items[i]], packed) <= max_tokens:
                group.append(i)
                break
        else:
            groups.append([i])
    return sorted(sorted(g) for g in groups)


def split_to(groups: list[list[int]], count: int) -> list[list[int]]:
    """Split the largest groups in two (halves in index order) until there are `count` groups."""
    groups = [list(g) for g in groups]
    while len(groups) < count:
        k = max(range(len(groups)), key=lambda j: (len(groups[j]), -j))
        if len(groups[k]) < 2:
            raise ValueError(f"cannot cut {sum(map(len, groups))} items into {count} micro-batches")
        g = groups.pop(k)
        half = len(g) // 2
        groups[k:k] = [g[:half], g[half:]]
    return groups


def plan(items: Sequence[Item], micro_batch: int, max_tokens: int, packed: bool,
         agree: bool = True) -> list[list[int]]:
    """This rank's forwards over `items` (indices into it): by the token budget when max_tokens > 0,
    with as many forwards as the rank that needs most (`agree`: every rank calls this together),
    else `micro_batch` items at a time."""
    if max_tokens <= 0:
        return fixed(len(items), micro_batch)
    groups = by_tokens(items, max_tokens, packed)
    if agree:
        from rlft import dist

        if dist.info().world_size > 1:
            groups = split_to(groups, int(dist.all_reduce_max([float(len(groups))])[0]))
    return groups


def plan_for(train_cfg, items: Sequence[Item], items_per_micro_batch: int | None = None,
             agree: bool = True) -> list[list[int]]:
    """`plan` with the train config's micro-batch size, token budget and packing."""
    return plan(items, items_per_micro_batch or train_cfg.micro_batch_per_device,
                int(train_cfg.max_tokens_per_micro_batch or 0), bool(train_cfg.packing), agree)


def rollout_groups(attention_mask, first: int, count: int, micro: int, max_tokens: int = 0,
                   packed: bool = False, unit: int = 1) -> list:
    """The rows first..first+count-1 of a rollout ([N, L] attention mask) cut into forwards by `plan`:
    `micro` rows at a time, or by the token budget `max_tokens`; `unit` consecutive rows stay together
    (2: a pair). Each forward is a tensor of row indices."""
    import torch

    lengths = attention_mask[first:first + count].sum(-1).tolist()
    items = [lengths[i:i + unit] for i in range(0, count, unit)]
    return [torch.tensor([first + unit * i + u for i in group for u in range(unit)])
            for group in plan(items, max(1, micro // unit), max_tokens, packed)]
