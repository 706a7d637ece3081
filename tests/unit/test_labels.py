"""Reward-model labels of a policy's samples: outcome pairs, exact step labels on the built-in task,
Math-Shepherd Monte-Carlo labels from continuations (docs/algorithms.md §2)."""
from rlft.data.labels import exact_step_labels, mc_step_labels, outcome_pairs, step_prefixes
from rlft.rewards.verifiers import answers_match, extract_answer

GOLD_STEPS = ["23+15=38", "38-7=31"]


def reaches(gold: str):
    """The answer check the environment gives the labellers: the text's final answer is `gold`."""
    return lambda text: answers_match(extract_answer(text), gold)


def test_exact_labels_follow_the_worked_solution_until_the_first_slip():
    assert exact_step_labels(["23+15=38", "38-7=31", "#### 31"], GOLD_STEPS, reaches("31")) == [1, 1, 1]
    # a dropped carry in step 1: it and every later reasoning step can no longer reach the answer
    assert exact_step_labels(["23+15=48", "48-7=41", "#### 41"], GOLD_STEPS, reaches("31")) == [0, 0, 0]
    assert exact_step_labels(["23+15=38", "38-7=32", "#### 32"], GOLD_STEPS, reaches("31")) == [1, 0, 0]
    # a lucky final answer after a wrong step: the answer line itself is right
    assert exact_step_labels(["23+15=39", "#### 31"], GOLD_STEPS, reaches("31")) == [0, 1]
    # spacing does not matter; an extra line beyond the worked solution is wrong
    assert exact_step_labels(["23 + 15 = 38", "38-7=31", "31+0=31"], GOLD_STEPS, reaches("31")) == [1, 1, 0]


def test_mc_labels_are_the_math_shepherd_estimates():
    steps = ["23+15=38", "38-7=32", "#### 32"]
    prefixes = step_prefixes(steps)
    assert prefixes[1] == "23+15=38\n38-7=32\n"
    continuations = [["38-7=31\n#### 31", "38-7=30\n#### 30"],  # one of two reaches the gold answer
                     ["#### 32", "32-1=31\n#### 31"],  # a lucky recovery still counts (hard estimate)
                     ["", ""]]  # after a wrong answer line nothing reaches it
    hard, soft = mc_step_labels(continuations, prefixes, reaches("31"))
    assert hard == [1, 1, 0] and soft == [0.5, 0.5, 0.0]


def test_outcome_pairs_stay_within_a_question():
    records = [{"prompt_text": f"q{g}", "completion": f"c{g}{i}", "correct": c}
               for g, flags in enumerate([(True, False, False, True), (True, True, True, True)])
               for i, c in enumerate(flags)]
    pairs = outcome_pairs(records, 4)
    assert [(p["chosen"], p["rejected"]) for p in pairs] == [("c00", "c01"), ("c03", "c02")]
    assert all(p["prompt_text"] == "q0" for p in pairs)


def test_the_exact_step_scorer_scores_steps_against_the_rows_worked_solution():
    from omegaconf import OmegaConf

    from rlft.config.schema import Config
    from rlft.envs.math import MathEnv
    from rlft.rewards.scoring import ExactSteps

    row = {"response": "23+15=38\n38-7=31\n#### 31", "answer": "31"}
    completions = ["23+15=38\n38-7=31\n#### 31", "23+15=48\n\n48-7=41\n#### 41", "23+15=38\n38-7=32\n#### 31"]
    scores, ends = ExactSteps(MathEnv(OmegaConf.structured(Config))).steps(["p"] * 3, completions, [row] * 3)
    assert scores == [[1.0, 1.0, 1.0], [0.0, 0.0, 0.0], [1.0, 0.0, 1.0]]
    # each step's end offset in its completion (the blank line is not a step)
    assert ends[1] == [len("23+15=48"), len("23+15=48\n\n48-7=41"), len(completions[1])]
    assert [completions[0][:e].split("\n")[-1] for e in ends[0]] == ["23+15=38", "38-7=31", "#### 31"]


def test_the_prms_solution_scores_are_paired_like_the_rms_pairs():
    from rlft.stages.reward import paired_accuracy

    questions = ["a", "a", "a", "b", "b", "c"]
    correct = [True, False, False, True, False, True]
    # a: (0.9 vs 0.5) right; b: (0.1 vs 0.4) wrong; c has no incorrect sample; a's second incorrect is unpaired
    assert paired_accuracy(questions, correct, [0.9, 0.5, 0.95, 0.1, 0.4, 0.3]) == {"eval_pair_acc": 0.5}
    assert paired_accuracy(["a", "b"], [True, True], [1.0, 2.0]) == {}
