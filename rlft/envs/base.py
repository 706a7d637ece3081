"""The environment interface: what a task tells the sampling stages (docs/environments.md).

An environment owns a task's data and its judgement:

    rows(split)                 the rows of a split: each a dict with `prompt` (text or chat messages)
                                and whatever the environment needs to score it (e.g. `answer`)
    step(row, transcript)       after a model turn that ended on one of `stop`: the environment's reply
                                (text appended as environment tokens, or the end of the trajectory)
    score(row, completion)      the outcome: a reward (partial credit allowed), whether it is correct,
                                and the answer it extracted (maj@k votes on answers)
    demonstration(row)          SFT text for the row as segments (text, trained?): what a tool
                                supplies is context, not a target
    step_labels(row, steps)     optional: exact 0/1 labels of reasoning steps (process supervision)
    use_tokenizer(tokenizer)    optional: the policy's tokenizer, given before sampling or encoding (e.g.
                                to speak its tool-call format)
    curriculum_levels(),        optional: difficulty levels of the training rows (env.curriculum): the
      level_rows(level)         highest level, and the rows at one
    describe()                  optional: a line for the run header (e.g. a tool's sandbox), asked before
                                a sampling stage starts

A single-turn task is one step: `stop` is empty and `step` is never called. A multi-turn task lists
the strings that end a model turn (a tool call's last characters) in `stop`; rlft's episode driver
(rlft/envs/episodes.py) then samples turn by turn and never re-encodes what the model wrote.
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass
class Reply:
    """The environment's answer to a model turn."""
    text: str = ""
    """Appended after the model's turn as environment tokens (context, loss weight 0). Empty with
    done=False: nothing to add, the model's turn simply goes on."""
    done: bool = False
    """The trajectory ends here."""
    role: str | None = None
    """With a chat template: the reply is a message of this role (e.g. `tool`), rendered by the template;
    None, or without a chat template: `text` as it is."""
    content: str | None = None
    """The message's content when it is rendered as a message (None: `text`)."""
    error: str | None = None
    """What went wrong in the tool (a parse error, a time limit), counted and logged."""
    tool_call: bool = False
    """The model's turn was a tool call (counted: the share of trajectories that use the tool)."""


@dataclass
class Score:
    """The environment's judgement of one finished trajectory."""
    reward: float
    """The outcome reward (1/0 for an exact checker, partial credit where the task gives it)."""
    correct: bool
    """Counts as solved (accuracy, pass@k)."""
    answer: str | None = None
    """The extracted final answer in a canonical form (maj@k votes on it; None: no answer)."""


class Environment:
    """Base class of every environment; subclasses implement `rows` and `score` at least."""

    name = "environment"
    stop: tuple[str, ...] = ()
    """Strings that end a model turn early (besides EOS): the environment's `step` then replies."""
    max_turns: int = 1
    """Most model turns per trajectory (env.max_turns overrides it when > 0)."""
    options_read: tuple[str, ...] = ("options",)
    """The env.* options it reads besides those of every environment (env.name, max_turns, max_env_tokens,
    curriculum); one of the others set on the command line is refused (a user environment reads env.options)."""

    def __init__(self, cfg=None):
        """`cfg`: the run's config (rlft passes it; env.* holds the options)."""
        self.cfg = cfg
        self.tokenizer = None
        if cfg is not None and cfg.env.max_turns:
            self.max_turns = int(cfg.env.max_turns)

    # ---------------------------------------------------------------- data
    def rows(self, split: str) -> list[dict]:
        """The rows of `split` ("train" or "test"), each with `prompt`; the same list on every call."""
        raise NotImplementedError

    def check_rows(self, rows: list[dict], name: str) -> int:
        """Refuse rows the environment cannot judge, naming the first (a DataError); or, where the user
        allowed them, the count of such rows."""
        return 0

    def gold(self, row: dict) -> str | None:
        """The row's reference answer as text, for records a person reads (samples.jsonl)."""
        answer = row.get("answer")
        return None if answer is None else str(answer)

    def demonstration(self, row: dict) -> list[tuple[str, bool]]:
        """SFT text for `row` as (text, trained) segments; the default: the row's `response`, all trained."""
        if "response" not in row:
            raise NotImplementedError(f"environment {self.name} has no demonstrations for its rows")
        return [(str(row["response"]), True)]

    def curriculum_levels(self) -> int:
        """Optional (env.curriculum): the highest difficulty level of the training rows; environments without
        levels do not override it."""
        raise NotImplementedError(f"environment {self.name} has no difficulty levels")

    def level_rows(self, level: int) -> list[dict]:
        """Optional (env.curriculum): the training rows at difficulty `level` (0 the easiest), disjoint from the
        held-out rows; the same list on every call."""
        raise NotImplementedError(f"environment {self.name} has no difficulty levels")

    def describe(self) -> str:
        """A line for the run header on what the environment runs under (e.g. the sandbox a tool's code runs
        in); empty: nothing to say. Asked before a sampling stage starts: a ConfigError raised here stops
        the run in one line."""
        return ""

    def use_tokenizer(self, tokenizer) -> None:
        """The policy's tokenizer, given by the stages that sample or encode (not by the command line's
        checks before a run); the default keeps it as `self.tokenizer`."""
        self.tokenizer = tokenizer

    # ---------------------------------------------------------------- interaction
    def step(self, row: dict, transcript: str) -> Reply:
        """The reply to a model turn that ended on a `stop` string; `transcript` is everything the model
        and the environment wrote after the prompt so far (decoded for reading only)."""
        return Reply(done=True)

    def steps(self, rows: list[dict], transcripts: list[str]) -> list[Reply]:
        """`step` for every trajectory waiting on the environment (one call per turn; an environment whose
        steps are slow, e.g. running code, may run them concurrently)."""
        return [self.step(r, t) for r, t in zip(rows, transcripts)]

    # ---------------------------------------------------------------- judgement
    def score(self, row: dict, completion: str) -> Score:
        raise NotImplementedError

    def scores(self, rows: list[dict], completions: list[str]) -> list[Score]:
        return [self.score(r, c) for r, c in zip(rows, completions)]

    def step_labels(self, row: dict, steps: list[str]) -> list[int]:
        """Exact 0/1 labels of a completion's reasoning steps, where the task can give them."""
        raise NotImplementedError(f"environment {self.name} has no exact step labels; use reward.process=prm "
                                  "or iterative.step_labels=mc")

    def close(self) -> None:
        """Release what the environment holds (subprocesses, files)."""
