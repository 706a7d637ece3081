"""Answer extraction, normalisation and rule rewards."""

import pytest

from rlft.rewards.verifiers import (
    REWARD_FUNCTIONS,
    answers_match,
    extract_answer,
    format_reward,
    gold_answer,
    normalize_answer,
)


@pytest.mark.parametrize("text,expected", [
    ("So she has 18 eggs.\n#### 18", "18"),
    ("#### 5\nthen again\n#### -7 \nbye", "-7"),  # the LAST ####, up to the end of its line
    ("total is 1,234\n#### 1,234", "1,234"),
    ("The answer is \\boxed{42}.", "42"),
    ("\\boxed{1} then \\boxed{\\frac{1}{2}}", "\\frac{1}{2}"),  # last boxed, nested braces
    ("\\boxed{a{b{c}}d} \\boxed{oops", "a{b{c}}d"),  # an unbalanced later box is skipped
    ("\\boxed{3}\n#### 4", "4"),  # whichever comes last
    ("#### 4 and \\boxed{3}", "3"),
    ("no answer here", None),
    ("####   \n", None),
    ("", None),
    (None, None),
])
def test_extract_answer(text, expected):
    assert extract_answer(text) == expected


@pytest.mark.parametrize("raw,expected", [
    (" 1,234 ", "1234"),
    ("1,234,567.50", "1234567.5"),
    ("3.0", "3"),
    ("-0", "0"),
    ("-0.0", "0"),
    ("0.50", "0.5"),
    ("+5", "5"),
    ("$18.", "18"),
    ("\\$18", "18"),
    ("2/4", "0.5"),
    ("1/3", "1/3"),
    ("-2/6", "-1/3"),
    ("\\frac{3}{4}", "0.75"),
    ("\\dfrac{2}{3}", "2/3"),
    ("\\text{12}", "12"),
    ("x = 3", "x=3"),
    ("(1,2)", "(1,2)"),
    ("", None),
    (None, None),
])
def test_normalize_answer(raw, expected):
    assert normalize_answer(raw) == expected


@pytest.mark.parametrize("pred,gold,ok", [
    ("0.50", "0.5", True),
    ("1,000", "1000", True),
    ("1/2", "0.5", True),
    ("-3", "3", False),
    ("3.01", "3", False),
    ("\\frac{1}{3}", "1/3", True),
    ("x=3", "x = 3", True),
    (None, "3", False),
    ("3", None, False),
])
def test_answers_match(pred, gold, ok):
    assert answers_match(pred, gold) is ok


def test_gold_answer_accepts_full_gsm8k_solution_or_bare_value():
    assert gold_answer("Janet sells 16 - 3 - 4 = 9 eggs.\n#### 18") == "18"
    assert gold_answer(" 72 ") == "72"
    assert gold_answer("  ") is None


def test_the_math_environments_correctness():
    from omegaconf import OmegaConf

    from rlft.config.schema import Config
    from rlft.envs.math import MathEnv

    env = MathEnv(OmegaConf.structured(Config))
    completions = [
        "step one\n#### 1,234",  # matches gold "1234" written with a comma
        "I think \\boxed{-5}",  # negative boxed answer
        "#### 2.50",  # decimal against a full GSM8K solution
        "no final answer",
        "#### 7\nwait, #### 8",  # last #### wins: 8 != 7
    ]
    gold = ["1234", "-5", "She pays 5/2 dollars.\n#### 2.5", "3", "7"]
    rewards = [s.reward for s in env.scores([{"answer": g} for g in gold], completions)]
    assert rewards == [1.0, 1.0, 1.0, 0.0, 0.0]


def test_format_reward():
    completions = [
        "reasoning...\n#### 42",
        "reasoning...\n#### -3.5  \n\n",  # trailing whitespace is fine
        "#### 1\n#### 2",  # two final answers
        "the answer is 42",  # none
        "#### 42\nmore text after",  # not at the end
        "#### forty-two",  # not a number
        "\\boxed{42}",  # boxed is not the #### format
    ]
    assert format_reward([""] * 7, completions) == [1.0, 1.0, 0.0, 0.0, 0.0, 0.0, 0.0]


def test_reward_functions_are_registered():
    assert REWARD_FUNCTIONS.get("format") is format_reward
