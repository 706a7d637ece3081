"""Reward sources (rlft.rewards.scoring): step splitting, weights, user functions by import
path, and the weighted total per source."""
from __future__ import annotations

import pytest
import torch
from omegaconf import OmegaConf

from helpers import USER_REWARD
from rlft.registry import UnknownNameError
from rlft.rewards import scoring
from rlft.rewards.scoring import RewardError, RewardSet, load_user_function, source_weights, split_steps


# ----------------------------------------------------------------------------- split_steps
@pytest.mark.parametrize("text, steps, ends", [
    ("3+4=7\n7-2=5\n#### 5", ["3+4=7", "7-2=5", "#### 5"], [5, 11, 18]),
    ("a  \n\n   \nb\n", ["a", "b"], [1, 10]),
    ("  indented\nx", ["  indented", "x"], [10, 12]),
    ("", [], []),
    ("\n\n", [], []),
    ("single", ["single"], [6]),
])
def test_split_steps(text, steps, ends):
    got_steps, got_ends = split_steps(text)
    assert got_steps == steps and got_ends == ends
    for step, end in zip(got_steps, got_ends):
        assert text[:end].endswith(step)


# ----------------------------------------------------------------------------- source_weights
def test_source_weights_defaults_and_values():
    assert source_weights(["correctness"], []) == {"correctness": 1.0}
    assert source_weights(["correctness", "format"], [1.0, 0.1]) == {"correctness": 1.0, "format": 0.1}
    w = source_weights(["a", "b", "c"], [2, 0, -1])
    assert list(w) == ["a", "b", "c"] and w == {"a": 2.0, "b": 0.0, "c": -1.0}


@pytest.mark.parametrize("names, weights, needle", [
    (["correctness", "format"], [1.0], "reward.weights has 1 values for 2"),
    (["correctness"], [1.0, 2.0], "reward.weights has 2 values for 1"),
    (["correctness", "correctness"], [], "twice"),
    ([], [], "reward.functions is empty"),
])
def test_source_weights_errors_are_one_line(names, weights, needle):
    with pytest.raises(UnknownNameError) as exc:
        source_weights(names, weights)
    msg = str(exc.value)
    assert needle in msg and "\n" not in msg


# ----------------------------------------------------------------------------- user functions
def test_load_user_function_by_import_path():
    fn = load_user_function(f"{USER_REWARD}:always_one")
    assert fn(["p", "q"], ["a", "b"]) == [1.0, 1.0]


@pytest.mark.parametrize("spec, needles", [
    ("nope", ["unknown reward 'nope'", "correctness", "format", "rm", "prm", "package.module:function"]),
    ("no_such_module_xyz:fn", ["cannot import no_such_module_xyz", "No module named"]),
    (f"{USER_REWARD}:missing", [f"{USER_REWARD} has no function missing"]),
    (f"{USER_REWARD}:NOT_A_FUNCTION", [f"{USER_REWARD} has no function NOT_A_FUNCTION"]),
])
def test_load_user_function_errors_name_the_problem(spec, needles):
    with pytest.raises(UnknownNameError) as exc:
        load_user_function(spec)
    msg = str(exc.value)
    assert "\n" not in msg, msg
    for needle in needles:
        assert needle in msg, msg


# ----------------------------------------------------------------------------- RewardSet
def reward_cfg(functions, weights=()):
    from rlft.config.schema import Config

    return OmegaConf.merge(OmegaConf.structured(Config),
                           {"reward": {"functions": list(functions), "weights": list(weights)}})


ROWS = [{"prompt": "Q: 1+2?", "answer": "1+2=3\n#### 3"}, {"prompt": "Q: 1+2?", "answer": "1+2=3\n#### 3"},
        {"prompt": "Q: 5-1?", "answer": "#### 4"}, {"prompt": "Q: 5-1?", "answer": "#### 4"}]
COMPLETIONS = ["1+2=3\n#### 3", "#### 4", "5-1=4\n#### 4", "no answer"]


def call(rs, completions=COMPLETIONS, rows=ROWS):
    prompts = [r["prompt"] for r in rows]
    return rs(prompts, [p + "\nA:\n" for p in prompts], completions, rows)


def test_reward_set_weighted_sum_per_source():
    rs = RewardSet(reward_cfg(["correctness", f"{USER_REWARD}:answer_length", "format"], [2.0, 0.5, -1.0]),
                   torch.device("cpu"))
    total, per_source = call(rs)
    correct = [1.0, 0.0, 1.0, 0.0]
    lengths = [len(r["answer"]) + len(c) for r, c in zip(ROWS, COMPLETIONS)]
    fmt = [1.0, 1.0, 1.0, 0.0]
    assert per_source == {"correctness": correct, f"{USER_REWARD}:answer_length": [float(x) for x in lengths],
                          "format": fmt}
    assert total.dtype == torch.float64 and total.shape == (4,)
    want = [2.0 * c + 0.5 * n - 1.0 * f for c, n, f in zip(correct, lengths, fmt)]
    assert total.tolist() == pytest.approx(want, abs=1e-12)


def test_reward_set_default_weights_are_one():
    rs = RewardSet(reward_cfg([f"{USER_REWARD}:always_one", f"{USER_REWARD}:alternate"]), torch.device("cpu"))
    total, per_source = call(rs)
    assert per_source[f"{USER_REWARD}:alternate"] == [1.0, 0.0, 1.0, 0.0]
    assert total.tolist() == [2.0, 1.0, 2.0, 1.0]


# ----------------------------------------------------------------------------- the contract of a user function
@pytest.mark.parametrize("function, expected", [
    ("wrong_count", "returned 3 values for 4 completions; it must return one finite number per completion (4 here)"),
    ("nan_for_the_second", "returned nan for sample 1; it must return one finite number per completion"),
    ("strings", "returned str '1.0' for sample 0"),
    ("nothing", "returned NoneType 'None'"),
    ("a_scalar", "returned float '1.0'"),
    ("raises", "raised KeyError: 'score'"),
])
def test_a_function_that_breaks_the_contract_is_one_line_naming_it(function, expected):
    rs = RewardSet(reward_cfg([f"{USER_REWARD}:{function}"]), torch.device("cpu"))
    with pytest.raises(RewardError) as exc:
        call(rs)
    line = str(exc.value)
    assert line.startswith(f"reward '{USER_REWARD}:{function}' ") and expected in line and "\n" not in line


def test_nonfinite_zero_counts_a_nan_as_zero(capsys):
    cfg = reward_cfg([f"{USER_REWARD}:nan_for_the_second"])
    cfg.reward.nonfinite = "zero"
    rs = RewardSet(cfg, torch.device("cpu"))
    for _ in range(2):
        total, _ = call(rs)
        assert total.tolist() == [1.0, 0.0, 1.0, 1.0]
    assert capsys.readouterr().out.count("non-finite") == 1  # said once


def test_a_slow_function_is_shown_and_bounded(monkeypatch, capsys):
    monkeypatch.setattr(scoring, "WAIT_NOTICE_S", 0.5)
    cfg = reward_cfg([f"{USER_REWARD}:slow"])
    rs = RewardSet(cfg, torch.device("cpu"))
    call(rs)  # 2 s: finishes, after saying what it waits on
    assert f"waiting on reward {USER_REWARD}:slow, " in capsys.readouterr().out
    cfg.reward.timeout_s = 1.0
    with pytest.raises(RewardError, match=r"did not return within reward.timeout_s=1 s"):
        call(RewardSet(cfg, torch.device("cpu")))


def test_the_preflight_calls_each_function_once_on_a_row():
    cfg = reward_cfg([f"{USER_REWARD}:raises"])
    scoring.check_sources(cfg)  # imports only: fine
    with pytest.raises(RewardError, match="raised KeyError.*checked before the run starts"):
        scoring.check_sources(cfg, ROWS[0])
    scoring.check_sources(reward_cfg([f"{USER_REWARD}:answer_length"]), ROWS[0])


def test_reward_set_unknown_source_fails_at_construction():
    with pytest.raises(UnknownNameError, match="unknown reward 'corectness'"):
        RewardSet(reward_cfg(["corectness"]), torch.device("cpu"))


# ----------------------------------------------------------------------------- a user environment's scores
class ScoringEnv:
    """A user environment whose scores are whatever `make` returns (the contract's faults)."""
    name = "scoring"

    def __init__(self, make):
        self.make = make

    def scores(self, rows, completions):
        return self.make(completions)


@pytest.mark.parametrize("make, expected", [
    (lambda cs: [scoring_score(1.0)] * (len(cs) - 1), "returned 3 values for 4 completions"),
    (lambda cs: [scoring_score(float("nan"))] * len(cs), "returned nan for sample 0"),
    (lambda cs: [scoring_score("yes")] * len(cs), "returned str 'yes' for sample 0"),
    (lambda cs: 1 / 0, "raised ZeroDivisionError: division by zero"),
])
def test_a_user_environment_that_breaks_the_contract_is_one_line_naming_it(make, expected):
    rs = RewardSet(reward_cfg(["correctness"]), torch.device("cpu"), env=ScoringEnv(make))
    with pytest.raises(RewardError) as exc:
        call(rs)
    line = str(exc.value)
    assert line.startswith(f"reward '{__name__}:ScoringEnv.scores' ") and expected in line and "\n" not in line


def test_a_user_environment_that_keeps_the_contract_scores():
    rs = RewardSet(reward_cfg(["correctness"]), torch.device("cpu"),
                   env=ScoringEnv(lambda cs: [scoring_score(float(len(c))) for c in cs]))
    assert call(rs)[1]["correctness"] == [float(len(c)) for c in COMPLETIONS]


def scoring_score(reward):
    from rlft.envs import Score

    return Score(reward=reward, correct=False, answer=None)
