"""`env=reasoning_gym`: procedural reasoning tasks of the reasoning-gym package, scored by their own code.

    rlft train algo=grpo env=reasoning_gym env.task=chain_sum
    rlft train algo=grpo env=reasoning_gym env.task=countdown env.task_config={min_numbers:3,max_numbers:4}
    rlft train algo=grpo env=reasoning_gym env.tasks={chain_sum:1,basic_arithmetic:2}   # a weighted mix

Rows are generated offline and seeded: the training split from one seed, the held-out split from
another, and a training row whose question is also a held-out question is dropped, so the splits are
disjoint. A row's prompt is the task's question (plus `env.instruction`); its answer is read from the
completion (`#### <answer>`, `\\boxed{}` or `<answer>...</answer>`) and scored by the task's own
`score_answer`, partial credit kept as the reward; correct means a full score. SFT demonstrations are
the task's own answers (`#### <answer>`). With `env.tasks`, each task contributes rows in proportion to
its weight, interleaved in a seeded order; `env.task_config` then maps task names to their options.
"""
from __future__ import annotations

import dataclasses
import random
import re

from rlft.envs.base import Environment, Score
from rlft.errors import ConfigError
from rlft.rewards import verifiers as V

SPLIT_SEEDS = {"train": 1, "test": 2}
TRAIN_SEED_OFFSET = 10_000_000
"""reasoning-gym generates item i of a dataset seeded s from the seed s + i, so two datasets whose seeds are closer
than their sizes share items (seeds 97 and 194: training item i + 97 is held-out item i). The training split's
seeds (and each curriculum level's) start this far past the held-out split's, so a training row repeats a held-out
question only where the task's settings allow few distinct questions."""
LEVEL = "level"  # env.curriculum: the training rows of level L are the split "levelL"
_ANSWER_TAG = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)


def split_seed(env_seed: int, split: str) -> int:
    """The base of a split's reasoning-gym seeds: env.seed * 1000 + 194 for the held-out split, TRAIN_SEED_OFFSET
    further for the training split. Callers add the task's index in a mixture, or a curriculum level's offset."""
    return env_seed * 1000 + SPLIT_SEEDS[split] * 97 + (TRAIN_SEED_OFFSET if split == "train" else 0)


def task_weights(env_cfg) -> dict[str, float]:
    tasks = dict(env_cfg.tasks) if env_cfg.tasks else {str(env_cfg.task): 1.0}
    bad = {k: v for k, v in tasks.items() if not float(v) > 0}
    if bad:
        raise ValueError(f"env.tasks weights must be > 0, got {bad}")
    return {str(k): float(v) for k, v in tasks.items()}


def task_options(env_cfg, name: str, mixed: bool) -> dict:
    options = dict(env_cfg.task_config or {})
    if mixed:
        options = dict(options.get(name) or {})
    return {k: (list(v) if hasattr(v, "__iter__") and not isinstance(v, str) else v) for k, v in options.items()}


def check_task_options(env_cfg, task: str, mixed: bool, config_class) -> None:
    """A ConfigError naming the task's options when env.task_config gives `task` one it does not have (with
    env.tasks: when env.task_config names a task the run does not mix)."""
    if mixed:
        stray = [k for k in (env_cfg.task_config or {}) if k not in task_weights(env_cfg)]
        if stray:
            raise ConfigError(f"env.task_config.{stray[0]}: with env.tasks, env.task_config maps each of the run's "
                              f"tasks to its options (env.task_config={{{task}:{{...}}}}); {stray[0]!r} is not one")
    known = [f.name for f in dataclasses.fields(config_class) if f.name not in ("seed", "size")]
    unknown = [k for k in task_options(env_cfg, task, mixed) if k not in known]
    if unknown:
        where = f"env.task_config.{task}" if mixed else "env.task_config"
        raise ConfigError(f"{where}: reasoning-gym task {task!r} has no option {unknown[0]!r}; its options: "
                          f"{', '.join(known)}")


def extract(completion: str) -> str | None:
    """The completion's final answer: `#### a` or `\\boxed{a}` (the later), else the last <answer> tag."""
    answer = V.extract_answer(completion)
    if answer is None:
        tags = _ANSWER_TAG.findall(completion or "")
        answer = tags[-1].strip() if tags and tags[-1].strip() else None
    return answer


class ReasoningGymEnv(Environment):
    name = "reasoning_gym"
    options_read = ("task", "task_config", "tasks", "train_size", "test_size", "seed", "instruction")

    def __init__(self, cfg):
        super().__init__(cfg)
        try:
            import reasoning_gym
        except ImportError as err:
            raise RuntimeError(f"env=reasoning_gym needs the reasoning-gym package ({err}); "
                               "pip install reasoning-gym") from None
        self.rg = reasoning_gym
        env_cfg = cfg.env
        self.weights = task_weights(env_cfg)
        unknown = [t for t in self.weights if t not in reasoning_gym.factory.DATASETS]
        if unknown:
            raise ValueError(f"env.task: unknown reasoning-gym task {unknown[0]!r}; e.g. "
                             f"{', '.join(sorted(reasoning_gym.factory.DATASETS)[:12])}, ... "
                             f"({len(reasoning_gym.factory.DATASETS)} tasks)")
        for task in self.weights:
            check_task_options(env_cfg, task, len(self.weights) > 1, reasoning_gym.factory.DATASETS[task][1])
        self.instruction = str(env_cfg.instruction or "")
        self.datasets: dict[tuple[str, str], object] = {}
        self.entries: dict[tuple[str, str], list[dict]] = {}  # generated once: the scorer reads them
        self._rows: dict[str, list[dict]] = {}

    def dataset(self, task: str, split: str, size: int):
        key = (task, split)
        if key not in self.datasets:
            seed = split_seed(int(self.cfg.env.seed), split) + sorted(self.weights).index(task)
            options = task_options(self.cfg.env, task, len(self.weights) > 1)
            self.datasets[key] = self.rg.create_dataset(task, size=max(size, 1), seed=seed, **options)
        return self.datasets[key]

    def generated(self, split: str) -> list[dict]:
        total = int(self.cfg.env.train_size if split == "train" else self.cfg.env.test_size)
        weight_sum = sum(self.weights.values())
        rows = []
        for task, weight in sorted(self.weights.items()):
            size = max(1, round(total * weight / weight_sum))
            data = self.dataset(task, split, size)
            entries = self.entries.setdefault((task, split), [data[i] for i in range(size)])
            for i, entry in enumerate(entries):
                prompt = entry["question"] + (f"\n{self.instruction}" if self.instruction else "")
                rows.append({"prompt": prompt, "answer": str(entry["answer"]), "task": task,
                             "_entry": [task, split, i]})
        if len(self.weights) > 1:
            random.Random(int(self.cfg.env.seed) + SPLIT_SEEDS[split]).shuffle(rows)
        return rows

    def rows(self, split: str) -> list[dict]:
        if split not in self._rows:
            rows = self.generated(split)
            if split == "train":  # disjoint from the held-out questions
                held = {r["prompt"] for r in self.rows("test")}
                kept = [r for r in rows if r["prompt"] not in held]
                if len(kept) < len(rows):
                    few = len(kept) < len(rows) / 2  # the task's settings allow few distinct questions
                    print(f"[rlft] env=reasoning_gym: dropped {len(rows) - len(kept)} of {len(rows)} training row(s) "
                          "whose question is also held out" + ("; these task settings have few distinct questions: "
                                                               "widen env.task_config or lower env.test_size"
                                                               if few else ""), flush=True)
                rows = kept
                limit = self.cfg.data.max_train_rows
            else:
                limit = self.cfg.data.max_test_rows
            self._rows[split] = rows[:limit] if limit else rows
        return self._rows[split]

    def entry(self, row: dict) -> tuple[object, dict]:
        """The task's dataset and entry behind a row (the scorer reads the entry's metadata)."""
        task, split, index = row["_entry"]
        if (task, split) not in self.datasets:
            self.level_rows(int(split[len(LEVEL):])) if split.startswith(LEVEL) else self.rows(split)
        return self.datasets[(task, split)], self.entries[(task, split)][index]

    # ---------------------------------------------------------------- env.curriculum: the task's own levels
    def curriculum(self):
        """(task, its reasoning-gym curriculum, the attributes that follow the level)."""
        from reasoning_gym.factory import create_curriculum, has_curriculum

        if len(self.weights) > 1:
            raise ConfigError("env.curriculum follows one task's curriculum: set env.task, not env.tasks")
        task = next(iter(self.weights))
        if not has_curriculum(task):
            raise ConfigError(f"env.curriculum: reasoning-gym task {task!r} has no curriculum; drop env.curriculum")
        curriculum = create_curriculum(task)
        attributes = [str(a) for a in self.cfg.env.curriculum.attributes] or list(curriculum.attributes)
        unknown = [a for a in attributes if a not in curriculum.attributes]
        if unknown:
            raise ConfigError(f"env.curriculum.attributes: {task} has no attribute {unknown[0]!r}; its curriculum's "
                              f"attributes: {', '.join(curriculum.attributes)}")
        return task, curriculum, attributes

    def curriculum_levels(self) -> int:
        _, curriculum, attributes = self.curriculum()
        return max(len(curriculum.attributes[a].levels) for a in attributes) - 1

    def level_rows(self, level: int) -> list[dict]:
        """Training rows with the curriculum's attributes at `level` (each at most its own last level) and the
        task's other options from env.task_config; seeded per level, held-out questions left out."""
        split = f"{LEVEL}{level}"
        if split in self._rows:
            return self._rows[split]
        task, curriculum, attributes = self.curriculum()
        options = task_options(self.cfg.env, task, False)
        for name in attributes:
            curriculum.set_attr_level(name, min(level, len(curriculum.attributes[name].levels) - 1))
        generated = dataclasses.asdict(curriculum.generate_configuration(dict(options)))
        for name in attributes:
            attr = curriculum.attributes[name]
            keys = [attr.field_name] if hasattr(attr, "field_name") else [attr.lower_field_name,
                                                                           attr.upper_field_name]
            options.update({k: generated[k] for k in keys})
        size = int(self.cfg.env.train_size)
        seed = split_seed(int(self.cfg.env.seed), "train") + 7_919 * (level + 1)
        data = self.rg.create_dataset(task, **{**options, "size": max(size, 1), "seed": seed})
        self.datasets[(task, split)] = data
        entries = self.entries.setdefault((task, split), [data[i] for i in range(size)])
        held = {r["prompt"] for r in self.rows("test")}
        rows = []
        for i, entry in enumerate(entries):
            prompt = entry["question"] + (f"\n{self.instruction}" if self.instruction else "")
            if prompt not in held:
                rows.append({"prompt": prompt, "answer": str(entry["answer"]), "task": task, "_entry": [task, split, i]})
        limit = self.cfg.data.max_train_rows
        self._rows[split] = rows[:limit] if limit else rows
        if not self._rows[split]:
            raise ConfigError(f"env.curriculum: level {level} of {task} has no training question that is not held out; "
                              "lower env.test_size or start at another level")
        return self._rows[split]

    def score(self, row: dict, completion: str) -> Score:
        answer = extract(completion)
        data, entry = self.entry(row)
        try:
            reward = float(data.score_answer(answer, entry)) if answer is not None else 0.0
        except Exception:  # a task's scorer that cannot read this answer: no credit
            reward = 0.0
        return Score(reward=reward, correct=reward >= 1.0, answer=None if answer is None else answer.strip())

    def demonstration(self, row: dict) -> list[tuple[str, bool]]:
        return [(f"#### {row['answer']}", True)]
