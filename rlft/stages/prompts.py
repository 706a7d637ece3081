"""Which training prompts each RL rollout samples (docs/algorithms.md, "Choosing prompts").

    rlft train algo=grpo rollout.pool.enabled=true            # retire prompts always or never solved
    rlft train algo=grpo env=reasoning_gym env.curriculum.enabled=true   # raise the task's difficulty

By default a rollout's prompts are the next `rollout.prompts_per_step` rows of consecutive seeded shuffles of the
training rows (`common.step_indices`), a pure function of the rollout's index. Two options make the choice
depend on what the rollouts so far showed, as the field does to spend samples where they teach:

* the difficulty pool keeps each prompt's last group-mean reward; a prompt whose mean is at least
  `rollout.pool.easy` (always solved) or at most `rollout.pool.hard` (never solved) is retired: the data
  order skips it until `rollout.pool.revisit_after` rollouts have passed, and the next time the order reaches
  it, it is sampled and judged again. A group whose rewards are all equal teaches a group-relative advantage
  nothing, so retiring those prompts leaves the samples to the ones that do (prime-rl's difficulty buffer).
* the curriculum (an environment with difficulty levels: reasoning-gym's own curricula) starts at
  `env.curriculum.start_level` and moves one level up when the mean reward of the last `env.curriculum.window`
  rollouts at the current level reaches `env.curriculum.threshold`; each level has its own training rows.

Every rank makes the same choice from the same state: what each rank observed is gathered after every
rollout (`observe`, collective). The state is part of a checkpoint, so a resumed run samples the same prompts.
Rows chosen by the pool or the curriculum carry `_prompt` (their key) and `_level`; keys starting with `_`
are never shown to reward functions."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Optional

from rlft.stages.common import _permutation, step_indices

EXTRA_ROUND_SEED = 7919  # dynamic sampling's extra rounds draw from their own seeded order


@dataclass
class DifficultyPool:
    """Each prompt's last group-mean reward, and the prompts retired as always or never solved."""
    easy: float = 1.0
    hard: float = 0.0
    revisit_after: int = 20
    last: dict = field(default_factory=dict)
    """prompt key -> mean reward of its last group."""
    retired: dict = field(default_factory=dict)
    """prompt key -> ["solved" | "unsolved", rollout index it was retired at]."""
    revisited: int = 0
    """Retired prompts sampled again since the last metrics."""

    def eligible(self, key: str, rollout_index: int) -> bool:
        why = self.retired.get(key)
        return why is None or rollout_index >= why[1] + self.revisit_after

    def observe(self, key: str, mean_reward: float, rollout_index: int) -> None:
        if key in self.retired:
            self.revisited += 1
        self.last[key] = mean_reward
        if mean_reward >= self.easy:
            self.retired[key] = ["solved", rollout_index]
        elif mean_reward <= self.hard:
            self.retired[key] = ["unsolved", rollout_index]
        else:
            self.retired.pop(key, None)

    def metrics(self) -> dict[str, float]:
        solved = sum(1 for why, _ in self.retired.values() if why == "solved")
        out = {"pool/seen": float(len(self.last)), "pool/retired_solved": float(solved),
               "pool/retired_unsolved": float(len(self.retired) - solved), "pool/revisited": float(self.revisited)}
        self.revisited = 0
        return out


@dataclass
class Curriculum:
    """The difficulty level and the recent mean rewards at it."""
    level: int = 0
    max_level: int = 0
    threshold: float = 0.8
    window: int = 8
    recent: list = field(default_factory=list)
    """Mean reward of each of the last rollouts at the current level."""
    raised_at: list = field(default_factory=list)
    """Rollout indices at which the level went up."""
    sampled: int = -1
    """The highest level of the last observed rollout's prompts (what `curriculum/level` logs)."""

    def observe(self, level_means: dict[int, float], rollout_index: int) -> None:
        self.sampled = max(level_means, default=self.sampled)
        if self.level not in level_means:  # rollouts of an older level (asynchronous sampling) do not count
            return
        self.recent = (self.recent + [level_means[self.level]])[-self.window:]
        if len(self.recent) == self.window and sum(self.recent) / self.window >= self.threshold \
                and self.level < self.max_level:
            self.level += 1
            self.recent = []
            self.raised_at.append(rollout_index)

    def metrics(self) -> dict[str, float]:
        out = {"curriculum/level": float(self.sampled if self.sampled >= 0 else self.level)}
        if self.recent:
            out["curriculum/recent_reward"] = sum(self.recent) / len(self.recent)
        return out


def reward_sums(samples: list[tuple[dict, float]]) -> dict[str, list[float]]:
    """prompt key -> [reward sum, samples, level] of one rank's samples (what `observe` gathers)."""
    sums: dict[str, list[float]] = {}
    for row, reward in samples:
        entry = sums.setdefault(row["_prompt"], [0.0, 0.0, float(row["_level"])])
        entry[0] += float(reward)
        entry[1] += 1.0
    return sums


class PromptSource:
    """The rows each rollout samples, chosen the same way on every rank.

    `rows_at(level)` gives the training rows of a difficulty level (level 0 without a curriculum)."""

    def __init__(self, rows_at: Callable[[int], list[dict]], prompts_per_step: int, seed: int,
                 pool: Optional[DifficultyPool] = None, curriculum: Optional[Curriculum] = None):
        self.rows_at, self.prompts_per_step, self.seed = rows_at, prompts_per_step, seed
        self.pool, self.curriculum = pool, curriculum
        self.cursor = 0  # position in the current level's data order (the pool walks it)
        self.cursor_level = self.level
        self.skipped = 0  # retired prompts passed over since the last metrics

    @property
    def level(self) -> int:
        return self.curriculum.level if self.curriculum is not None else 0

    @property
    def adaptive(self) -> bool:
        return self.pool is not None or self.curriculum is not None

    def order_seed(self, level: int, round_: int) -> int:
        return self.seed + EXTRA_ROUND_SEED * round_ + 100_003 * level

    def select(self, rollout_index: int, round_: int = 0) -> list[dict]:
        """The global rows of a rollout (round > 0: dynamic sampling's extra draws, which change no state)."""
        level, rows = self.level, self.rows_at(self.level)
        if not self.adaptive:
            return [rows[i] for i in step_indices(rollout_index, self.prompts_per_step, len(rows),
                                                  self.order_seed(0, round_))]
        if round_ == 0:
            if level != self.cursor_level:  # a new level: its own rows, from the start of its order
                self.cursor, self.cursor_level = 0, level
            chosen, self.cursor = self.walk(rows, level, rollout_index, self.cursor, round_)
        else:
            chosen, _ = self.walk(rows, level, rollout_index, rollout_index * self.prompts_per_step, round_)
        return [dict(rows[i], _prompt=f"{level}:{i}", _level=level) for i in chosen]

    def walk(self, rows: list[dict], level: int, rollout_index: int, start: int, round_: int) -> tuple[list[int], int]:
        """The next prompts_per_step eligible indices of the data order from `start` (at most one pass over the
        rows; retired prompts fill up if too few are eligible, the longest-retired first); the end position."""
        n, want, chosen, pos = len(rows), self.prompts_per_step, [], start
        seed = self.order_seed(level, round_)
        while len(chosen) < want and pos - start < n:
            epoch, i = divmod(pos, n)
            index = int(_permutation(n, seed + epoch)[i])
            pos += 1
            if self.pool is None or self.pool.eligible(f"{level}:{index}", rollout_index):
                chosen.append(index)
            elif round_ == 0:
                self.skipped += 1
        if len(chosen) < want:  # everything retired: the prompts retired longest ago
            retired = sorted((since, key) for key, (_, since) in self.pool.retired.items()
                             if key.startswith(f"{level}:") and int(key.split(":")[1]) not in chosen)
            chosen += [int(key.split(":")[1]) for _, key in retired[:want - len(chosen)]]
        while len(chosen) < want:  # fewer rows than prompts per step
            chosen.append(chosen[len(chosen) % max(len(chosen), 1)] if chosen else 0)
        return chosen, pos

    def observe(self, samples: list[tuple[dict, float]], rollout_index: int, gather: Callable[[object], list]) -> None:
        """Collective: every rank's (row, reward) samples of a rollout (dynamic sampling's discarded groups
        too), gathered, update the pool and the curriculum in the same order on every rank."""
        if not self.adaptive:
            return
        merged: dict[str, list[float]] = {}
        for part in gather(reward_sums(samples)):
            for key, (total, count, level) in part.items():
                entry = merged.setdefault(key, [0.0, 0.0, level])
                entry[0] += total
                entry[1] += count
        if self.pool is not None:
            for key in sorted(merged):
                total, count, _ = merged[key]
                self.pool.observe(key, total / count, rollout_index)
        if self.curriculum is not None:
            by_level: dict[int, list[float]] = {}
            for total, count, level in merged.values():
                acc = by_level.setdefault(int(level), [0.0, 0.0])
                acc[0] += total
                acc[1] += count
            self.curriculum.observe({lv: t / c for lv, (t, c) in by_level.items()}, rollout_index)

    def metrics(self) -> dict[str, float]:
        out = {}
        if self.pool is not None:
            out.update(self.pool.metrics(), **{"pool/skipped": float(self.skipped)})
            self.skipped = 0
        if self.curriculum is not None:
            out.update(self.curriculum.metrics())
        return out

    def state(self) -> dict:
        """What a checkpoint keeps (plain data)."""
        out: dict = {"cursor": self.cursor, "cursor_level": self.cursor_level}
        if self.pool is not None:
            out["pool"] = {"last": dict(self.pool.last), "retired": {k: list(v) for k, v in self.pool.retired.items()}}
        if self.curriculum is not None:
            out["curriculum"] = {"level": self.curriculum.level, "recent": list(self.curriculum.recent),
                                 "raised_at": list(self.curriculum.raised_at), "sampled": self.curriculum.sampled}
        return out

    def restore(self, state: dict) -> None:
        self.cursor, self.cursor_level = int(state["cursor"]), int(state["cursor_level"])
        if self.pool is not None and "pool" in state:
            self.pool.last = dict(state["pool"]["last"])
            self.pool.retired = {k: list(v) for k, v in state["pool"]["retired"].items()}
        if self.curriculum is not None and "curriculum" in state:
            c = state["curriculum"]
            self.curriculum.level, self.curriculum.recent = int(c["level"]), list(c["recent"])
            self.curriculum.raised_at, self.curriculum.sampled = list(c["raised_at"]), int(c["sampled"])
