"""Choosing each rollout's prompts (rlft/stages/prompts.py): the plain data order, the difficulty pool, the
curriculum; their state round-trips, and every rank ends with the same state."""
from __future__ import annotations

import re

import pytest

from helpers import compose_config
from rlft.config.validate import validate
from rlft.errors import ConfigError
from rlft.stages.common import step_indices
from rlft.stages.prompts import Curriculum, DifficultyPool, PromptSource, reward_sums

ROWS = [{"prompt": f"q{i}"} for i in range(10)]
LEVELS = {level: [{"prompt": f"L{level}q{i}"} for i in range(6)] for level in range(3)}


def one_rank(part):
    return [part]


def feed(source: PromptSource, rows: list[dict], rollout: int, reward) -> None:
    """Each chosen row scored twice (a group of 2) by reward(row)."""
    source.observe([(row, reward(row)) for row in rows for _ in range(2)], rollout, one_rank)


def test_without_pool_or_curriculum_the_order_is_the_seeded_data_order():
    source = PromptSource(lambda level: ROWS, 4, seed=3)
    for r in range(5):
        assert source.select(r) == [ROWS[i] for i in step_indices(r, 4, 10, 3)]
        assert source.select(r, 2) == [ROWS[i] for i in step_indices(r, 4, 10, 3 + 2 * 7919)]
    assert not source.adaptive and source.metrics() == {}


def test_the_pool_skips_solved_and_unsolved_prompts_until_they_are_due_again():
    solved, unsolved = {"q0", "q1", "q2"}, {"q3", "q4"}
    reward = lambda row: 1.0 if row["prompt"] in solved else 0.0 if row["prompt"] in unsolved else 0.5  # noqa: E731
    source = PromptSource(lambda level: ROWS, 4, seed=0, pool=DifficultyPool(revisit_after=4))
    seen = []
    for r in range(8):
        rows = source.select(r)
        seen.append([row["prompt"] for row in rows])
        feed(source, rows, r, reward)
    # a retired prompt is sampled again only once revisit_after rollouts have passed since it was last judged
    for r in range(8):
        for prompt in set(seen[r]) & (solved | unsolved):
            earlier = [e for e in range(r) if prompt in seen[e]]
            assert not earlier or r >= earlier[-1] + 4, (prompt, r, earlier)
    m = source.metrics()
    assert m["pool/retired_solved"] == 3 and m["pool/retired_unsolved"] == 2 and m["pool/seen"] == 10
    assert m["pool/skipped"] > 0 and m["pool/revisited"] > 0
    assert all(row.get("_prompt", "").startswith("0:") for row in source.select(8))
    assert all(f"0:{i}" not in source.pool.retired for i in range(5, 10))  # mixed groups teach: never retired


def test_the_pool_fills_a_rollout_from_retired_prompts_when_too_few_are_eligible():
    source = PromptSource(lambda level: ROWS, 4, seed=0, pool=DifficultyPool(revisit_after=100))
    for r in range(3):
        feed(source, source.select(r), r, lambda row: 1.0)  # everything solved
    rows = source.select(3)
    assert len(rows) == 4 and len({row["_prompt"] for row in rows}) == 4


def test_extra_rounds_change_no_state_and_a_restored_source_chooses_the_same():
    reward = lambda row: float(int(row["prompt"][1:]) % 3 == 0)  # noqa: E731
    a = PromptSource(lambda level: ROWS, 3, seed=1, pool=DifficultyPool(revisit_after=2))
    for r in range(4):
        feed(a, a.select(r), r, reward)
    state = a.state()
    extra = a.select(4, round_=1)
    assert a.state() == state and len(extra) == 3
    b = PromptSource(lambda level: ROWS, 3, seed=1, pool=DifficultyPool(revisit_after=2))
    b.restore(state)
    for r in range(4, 9):
        rows_a, rows_b = a.select(r), b.select(r)
        assert rows_a == rows_b
        feed(a, rows_a, r, reward)
        feed(b, rows_b, r, reward)


def test_every_rank_ends_with_the_same_pool():
    """Two ranks observe different halves of a rollout; the gathered parts update both the same way."""
    sources = [PromptSource(lambda level: ROWS, 4, seed=0, pool=DifficultyPool()) for _ in range(2)]
    rows = sources[0].select(0)
    assert rows == sources[1].select(0)
    halves = [[(row, 1.0) for row in rows[:2]], [(row, 0.0) for row in rows[2:]]]
    parts = [reward_sums(half) for half in halves]  # what all_gather_object returns on every rank
    for rank, source in enumerate(sources):
        source.observe(halves[rank], 0, lambda part: parts)
    assert sources[0].state() == sources[1].state()
    assert sorted(why for why, _ in sources[0].pool.retired.values()) == ["solved"] * 2 + ["unsolved"] * 2


def test_the_curriculum_moves_up_when_the_recent_reward_passes_the_threshold():
    curriculum = Curriculum(level=0, max_level=2, threshold=0.75, window=2)
    source = PromptSource(lambda level: LEVELS[level], 3, seed=0, curriculum=curriculum)
    levels = []
    for r in range(8):
        rows = source.select(r)
        assert all(row["prompt"].startswith(f"L{source.level}") and row["_level"] == source.level for row in rows)
        levels.append(source.level)
        feed(source, rows, r, lambda row: 1.0 if row["_level"] < 2 else 0.5)
    assert levels == [0, 0, 1, 1, 2, 2, 2, 2]
    assert curriculum.raised_at == [1, 3]
    assert source.metrics() == {"curriculum/level": 2.0, "curriculum/recent_reward": 0.5}
    assert source.select(8)[0]["_level"] == 2


def test_rollouts_of_an_older_level_do_not_count_at_the_new_one():
    curriculum = Curriculum(level=1, max_level=2, threshold=0.5, window=1)
    curriculum.observe({0: 1.0}, 5)  # sampled before the level went up (asynchronous sampling)
    assert curriculum.level == 1 and curriculum.recent == []
    curriculum.observe({1: 0.6, 0: 0.0}, 6)
    assert curriculum.level == 2 and curriculum.raised_at == [6]


@pytest.mark.parametrize("overrides, needle", [
    (["algo=grpo", "rollout.pool.easy=0.9"], "rollout.pool.easy=0.9 is set but never used: it applies only with "
                                             "rollout.pool.enabled=true"),
    (["algo=sft", "rollout.pool.enabled=true"], "only the online RL loop reads it, not algo=sft"),
    (["algo=grpo", "env.curriculum.enabled=true"], "env=math has no difficulty levels"),
    (["algo=grpo", "env=reasoning_gym", "env.curriculum.window=3"], "it applies only with env.curriculum.enabled=true"),
])
def test_pool_and_curriculum_options_are_refused_where_unread(overrides, needle):
    with pytest.raises(ConfigError, match=re.escape(needle)):
        validate(compose_config(*overrides))


def test_the_experience_builds_the_configured_prompt_source():
    from rlft.envs.gym import ReasoningGymEnv
    from rlft.stages.experience import prompt_source

    cfg = compose_config("experiment=smollm2_grpo", "rollout.pool.enabled=true", "env.curriculum.enabled=true",
                         "env.curriculum.attributes=[num_digits]", "env.curriculum.max_level=1", "env.train_size=40",
                         "env.test_size=10")
    validate(cfg)
    env = ReasoningGymEnv(cfg)
    source = prompt_source(cfg, env, env.rows("train"))
    assert source.pool.revisit_after == 20 and source.curriculum.max_level == 1 and source.level == 0
    rows = source.select(0)
    assert len(rows) == cfg.rollout.prompts_per_step and all(r["_entry"][1] == "level0" for r in rows)
    assert all(len(n) == 1 for r in rows for n in r["prompt"].split("problem: ")[1].split(" =")[0].split()[::2])
    assert env.score(rows[0], f"#### {rows[0]['answer']}").correct  # level rows are scored by their own entries


def test_a_task_config_on_the_command_line_replaces_the_recipes():
    """experiment=smollm2_* sets chain_sum's options; another task's options replace them, not join them."""
    from rlft.overrides import set_dicts_as_given

    overrides = ["experiment=smollm2_sft", "env.task=leg_counting", "env.task_config={min_animals:1,max_animals:2}"]
    cfg = compose_config(*overrides[:2], "++env.task_config={min_animals:1,max_animals:2}")
    assert "min_terms" in cfg.env.task_config  # what Hydra alone composes
    set_dicts_as_given(cfg, overrides)
    assert dict(cfg.env.task_config) == {"min_animals": 1, "max_animals": 2}
