"""Turning sampled completions into the tensors the update reads.

Shapes (N completions on this rank, L = longest prompt + completion):
    input_ids, attention_mask  [N, L]     right-padded prompt ⊕ completion
    mask                       [N, L-1]   response mask aligned to targets: column p is 1 when
                                          token p+1 is a token the model sampled (up to the first
                                          EOS); environment tokens of a multi-turn trajectory are 0
    scores                     [N]        total reward after the truncation policy
    extras                                what the run's estimator or loss reads (EXTRAS below)
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch

from rlft.data.encode import collate_padded, pad_to


# What the experience step adds to a scored rollout, by name: a registered estimator or loss declares
# what it reads (`needs`), `rlft.stages.experience.rollout_needs` turns that into these names, and only
# those are computed. The update reads them with `Rollout.need` (a clear error when one is missing).
EXTRAS = {
    "step_ends": "per completion, the target column of the token that ends each step (process supervision)",
    "step_scores": "per completion, each step's score (process supervision)",
    "old_logp": "[N, L-1] the policy's log-probs at sampling time (pi_old)",
    "ref_logp": "[N, L-1] the reference model's log-probs",
    "teacher_logp": "[N, L-1] the teacher's log-probs (on-policy distillation)",
    "is_weight": "[N, L-1] engine-mismatch importance weights",
    "values": "[N, L-1] the critic's values at sampling time",
    "returns": "[N, L-1] the critic's targets",
    "adv": "[N, L-1] advantages",
    "pair_scores": "[N/2, 2] the two rewards of each pair (rows 2j, 2j+1)",
    "pair_s_ref": "[N/2, 2] the reference's sequence log-probs of each pair",
    "delta": "[N/2] each pair's reward difference",
}
PAIR_FIELDS = ("delta", "pair_scores", "pair_s_ref")


@dataclass
class Rollout:
    """A scored batch of trajectories: the core every RL algorithm reads (sampled tokens, masks,
    rewards), plus `extras`, the tensors its estimator or loss declared it needs (EXTRAS)."""
    rows: list[dict]
    prompt_texts: list[str]
    completions: list[str]
    completion_ids: list[list[int]]
    input_ids: torch.Tensor
    attention_mask: torch.Tensor
    mask: torch.Tensor
    truncated: torch.Tensor
    prompt_lens: list[int]
    scores: torch.Tensor = None
    per_source: dict = field(default_factory=dict)   # each reward source's value per completion
    sampler_logp: list[list[float]] | None = None  # the rollout engine's log-prob of each completion token
    token_mask: list[list[int]] | None = None  # multi-turn: 1 on each model token, 0 on environment tokens
    episode: dict = field(default_factory=dict)  # multi-turn: per-trajectory turns, tool_calls, tool_errors
    extras: dict = field(default_factory=dict)   # name (EXTRAS) -> value
    metrics: dict = field(default_factory=dict)  # measured while preparing it, logged (engine vs trainer gap)

    def __len__(self) -> int:
        return len(self.completions)

    def get(self, name: str):
        """The extra `name`, or None when this run did not compute it."""
        if name not in EXTRAS:
            raise KeyError(f"unknown rollout extra {name!r}; known: {', '.join(EXTRAS)}")
        return self.extras.get(name)

    def need(self, name: str, reader: str):
        """The extra `name` that `reader` cannot do without."""
        value = self.get(name)
        if value is None:
            raise ValueError(f"{reader} reads the rollout's {name} ({EXTRAS[name]}), which this run did not "
                             "compute: the estimator or loss that reads it must declare it in its needs")
        return value

    def put(self, **values) -> None:
        for name in values:
            self.get(name)  # a known name
        self.extras.update(values)


def build_sequences(prompt_ids: list[list[int]], completion_ids: list[list[int]], pad_id: int,
                    token_masks: list[list[int]] | None = None):
    """(input_ids [N, L], attention_mask [N, L], response mask [N, L-1]) from token lists;
    `token_masks` (multi-turn) weighs each completion token: 1 sampled by the model, 0 environment."""
    seqs = [p + c for p, c in zip(prompt_ids, completion_ids)]
    ids, attn = collate_padded(seqs, pad_id, side="right")
    weights = token_masks if token_masks is not None else [[1] * len(c) for c in completion_ids]
    masks = [[0] * (len(p) - 1) + list(w) for p, w in zip(prompt_ids, weights)]
    mask = pad_to(masks, 0, dtype=torch.float32)
    width = ids.shape[1] - 1
    if mask.shape[1] < width:
        mask = torch.nn.functional.pad(mask, (0, width - mask.shape[1]))
    return ids, attn, mask[:, :width]


def prompt_lens_of(ro, rows) -> list[int]:
    """The prompt lengths of some rows of a rollout (a slice, or a tensor or list of row indices)."""
    index = range(len(ro))[rows] if isinstance(rows, slice) else [int(i) for i in rows]
    return [ro.prompt_lens[i] for i in index]


def target_aligned(values: list[list[float]], prompt_lens: list[int], width: int) -> torch.Tensor:
    """Per-completion-token values as a [N, width] tensor aligned to targets (completion token j
    of row i sits in column prompt_lens[i] - 1 + j), 0 elsewhere."""
    out = torch.zeros(len(values), width)
    for i, (row, p) in enumerate(zip(values, prompt_lens)):
        row = row[:max(0, width - (p - 1))]
        if row:
            out[i, p - 1:p - 1 + len(row)] = torch.tensor(row, dtype=out.dtype)
    return out


def apply_truncation_policy(scores: torch.Tensor, mask: torch.Tensor, truncated: torch.Tensor,
                            policy: str, penalty: float) -> tuple[torch.Tensor, torch.Tensor]:
    """(scores, mask) after the policy for completions that hit max_new_tokens (docs/algorithms.md §0)."""
    scores, mask = scores.clone(), mask.clone()
    if policy == "zero_reward":
        scores[truncated] = 0.0
    elif policy == "penalty":
        scores[truncated] -= penalty
    elif policy == "mask":
        mask[truncated] = 0.0
    elif policy != "keep":
        raise ValueError(f"unknown truncation_policy '{policy}'; valid: keep, zero_reward, mask, penalty")
    return scores, mask


def token_char_ends(tokenizer, token_ids: list[int]) -> list[int]:
    """Length of the decoded completion after each token (to map text offsets to tokens)."""
    return [len(tokenizer.decode(token_ids[:j + 1], skip_special_tokens=True)) for j in range(len(token_ids))]


def step_columns(tokenizer, completion_ids: list[int], char_ends: list[int], prompt_len: int) -> list[int]:
    """Target-aligned column of the token that completes each step (its last character)."""
    cum = token_char_ends(tokenizer, completion_ids)
    cols = []
    for end in char_ends:
        j = next((i for i, n in enumerate(cum) if n >= end), len(cum) - 1)
        cols.append(prompt_len - 1 + j)
    return cols


def concat_rows(picks: list[tuple[Rollout, int]], pad_id: int = 0) -> Rollout:
    """A new rollout made of chosen rows of scored rollouts (dynamic sampling refills)."""
    prompt_ids = [src.input_ids[i, :src.prompt_lens[i]].tolist() for src, i in picks]
    completion_ids = [src.completion_ids[i] for src, i in picks]
    token_masks = [src.token_mask[i] for src, i in picks] if picks[0][0].token_mask is not None else None
    ids, attn, mask = build_sequences(prompt_ids, completion_ids, pad_id, token_masks)
    # keep each row's policy-adjusted mask (truncation_policy=mask zeroes whole rows)
    for k, (src, i) in enumerate(picks):
        if float(src.mask[i].sum()) == 0.0:
            mask[k] = 0.0
    out = Rollout(rows=[src.rows[i] for src, i in picks], prompt_texts=[src.prompt_texts[i] for src, i in picks],
                  completions=[src.completions[i] for src, i in picks], completion_ids=completion_ids,
                  input_ids=ids, attention_mask=attn, mask=mask,
                  truncated=torch.tensor([bool(src.truncated[i]) for src, i in picks]),
                  prompt_lens=[len(p) for p in prompt_ids],
                  scores=torch.stack([src.scores[i] for src, i in picks]),
                  per_source={name: [src.per_source[name][i] for src, i in picks] for name in picks[0][0].per_source})
    if picks[0][0].sampler_logp is not None:
        out.sampler_logp = [src.sampler_logp[i] for src, i in picks]
    out.token_mask = token_masks
    out.episode = {name: [src.episode[name][i] for src, i in picks] for name in picks[0][0].episode}
    for name in ("step_ends", "step_scores"):  # the score phase's extras (the later phases run after merging)
        if picks[0][0].get(name) is not None:
            out.put(**{name: [src.get(name)[i] for src, i in picks]})
    return out


def take(ro: Rollout, order: list[int]) -> Rollout:
    """The rollout with its rows in `order` (a permutation); per-pair fields follow their pairs,
    so `order` must keep the rows (2j, 2j+1) of a pair together when the rollout has pairs."""
    n = len(ro)
    index = torch.tensor(order, dtype=torch.long)
    pair_index = index[0::2] // 2

    def reorder(name: str, value):
        if name in PAIR_FIELDS and value is not None:
            return value[pair_index]
        if isinstance(value, torch.Tensor) and value.dim() > 0 and value.shape[0] == n:
            return value[index]
        if isinstance(value, list) and len(value) == n:
            return [value[i] for i in order]
        return value

    out = {}
    for name, value in vars(ro).items():
        if name in ("per_source", "episode"):
            out[name] = {k: [v[i] for i in order] for k, v in value.items()}
        elif name == "extras":
            out[name] = {k: reorder(k, v) for k, v in value.items()}
        else:
            out[name] = reorder(name, value)
    return Rollout(**out)


def group_shuffle_order(n: int, group_size: int, seed: int) -> list[int]:
    """A seeded permutation of rows 0..n-1 that moves whole groups (a prompt's samples stay together)."""
    g = torch.Generator().manual_seed(seed)
    groups = torch.randperm(n // group_size, generator=g).tolist()
    return [k * group_size + j for k in groups for j in range(group_size)]
