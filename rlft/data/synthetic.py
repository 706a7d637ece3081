"""The built-in synthetic math task: arithmetic word problems with worked solutions.

A problem is a short story about one person's collection of items changed by a few operations::

    question: Ann has 23 pens. She buys 15 more. Then she gives away 7. How many pens does Ann have?
    answer:   23+15=38
              38-7=31
              #### 31

`answer` follows the GSM8K convention (reasoning lines, then `#### <final>`), so the same reward
verifier and loaders serve this task and real GSM8K. All numbers stay non-negative integers.

Besides SFT rows the module makes the data for the other stages without any model: preference
pairs (correct vs. corrupted solution) for reward models and DPO, and per-step labels for a process
reward model. A corruption puts one plausible arithmetic slip into a step and recomputes every later
step consistently from the wrong value, as a model that made that slip would.
"""

import random
from dataclasses import dataclass

# (name, subject pronoun). The pronoun starts a sentence after the first one.
NAMES = [
    ("Ann", "she"), ("Bob", "he"), ("Cat", "she"), ("Dan", "he"), ("Eve", "she"), ("Tom", "he"),
    ("Mia", "she"), ("Sam", "he"), ("Zoe", "she"), ("Max", "he"), ("Amy", "she"), ("Ben", "he"),
]
ITEMS = [
    "pens", "apples", "cards", "books", "coins", "shells",
    "stamps", "cups", "hats", "balls", "eggs", "toys",
]
# Phrasings per operation; `{p}` is the pronoun, `{n}` the operand.
PHRASES = {
    "+": ["{p} buys {n} more.", "{p} finds {n} more.", "{p} gets {n} more.", "{p} wins {n} more."],
    "-": ["{p} gives away {n}.", "{p} loses {n}.", "{p} sells {n}.", "{p} uses {n}."],
    "*": ["{p} gets {n} times as many.", "{p} ends with {n} times as many."],
}


@dataclass
class TaskSpec:
    """Difficulty and size of the synthetic task.

    The defaults are tuned so that the built-in tiny model (hidden 128, 2 layers, intermediate
    256, 4 heads) trained with SFT for 900 steps of 32 sequences (about 2 minutes on 2 CPU cores)
    stays well below its pass@8 in greedy accuracy: half of the training demonstrations come from
    a sloppy solver (`demo_slip_rate`), so the SFT policy mixes correct and carry-dropping
    arithmetic, and RL with the verifier has clear room to raise greedy accuracy.
    """

    min_ops: int = 1
    """Fewest operations (reasoning steps before `####`) in a problem."""
    max_ops: int = 2
    """Most operations in a problem."""
    max_operand: int = 20
    """Starting amounts are drawn from 2..max_operand, +/- operands from 1..max_operand."""
    max_factor: int = 3
    """Multipliers for `*` are drawn from 2..max_factor."""
    operations: str = "+-"
    """Which operations appear, any of "+-*"."""
    num_names: int = 12
    """How many distinct people (at most len(NAMES))."""
    num_items: int = 12
    """How many distinct item words (at most len(ITEMS))."""
    num_templates: int = 4
    """How many phrasings per operation (at most the number in PHRASES)."""
    num_train: int = 20000
    """Training problems."""
    num_test: int = 500
    """Held-out problems; their questions never appear in the training split."""
    demo_slip_rate: float = 0.5
    """Training split only: share of worked solutions written by a sloppy solver who drops carries
    and borrows (e.g. 17+25=32, 42-17=35). The gold `final` answer stays correct, as when SFT
    demonstrations are imperfect but the RL verifier knows the truth."""
    seed: int = 0
    """Seed of the split generator; the same spec always gives the same rows."""

    def __post_init__(self) -> None:
        unknown = set(self.operations) - set(PHRASES)
        if not self.operations or unknown:
            raise ValueError(f"operations must be drawn from '+-*', got {self.operations!r}")
        if not 1 <= self.min_ops <= self.max_ops:
            raise ValueError(f"need 1 <= min_ops <= max_ops, got {self.min_ops}, {self.max_ops}")
        if self.max_operand < 1 or self.max_factor < 2:
            raise ValueError("need max_operand >= 1 and max_factor >= 2")
        for knob, limit in [("num_names", NAMES), ("num_items", ITEMS)]:
            if not 1 <= getattr(self, knob) <= len(limit):
                raise ValueError(f"{knob} must be in 1..{len(limit)}")
        if self.num_templates < 1:
            raise ValueError("num_templates must be >= 1")
        if not 0.0 <= self.demo_slip_rate <= 1.0:
            raise ValueError(f"demo_slip_rate must be in [0, 1], got {self.demo_slip_rate}")


def apply_op(value: int, op: str, operand: int) -> int:
    """The result of one step: `value op operand`."""
    if op == "+":
        return value + operand
    if op == "-":
        return value - operand
    return value * operand


def format_step(value: int, op: str, operand: int, result: int) -> str:
    """One reasoning line, e.g. "23+15=38"."""
    return f"{value}{op}{operand}={result}"


def solution_text(steps: list[str], final: int | str) -> str:
    """A GSM8K-style solution: the reasoning lines, then `#### <final>`."""
    return "\n".join(steps + [f"#### {final}"])


def _choose_op(rng: random.Random, spec: TaskSpec, value: int) -> tuple[str, int]:
    """Pick an operation and operand that keep the running value non-negative."""
    ops = [op for op in spec.operations if op != "-" or value > 0]
    op = rng.choice(ops or ["+"])
    if op == "*":
        return op, rng.randint(2, spec.max_factor)
    if op == "-":
        return op, rng.randint(1, min(value, spec.max_operand))
    return op, rng.randint(1, spec.max_operand)


def make_problem(rng: random.Random, spec: TaskSpec) -> dict:
    """One problem: `question`, `steps` (list of lines), `answer` (GSM8K solution), `final` (str)."""
    name, pronoun = rng.choice(NAMES[: spec.num_names])
    item = rng.choice(ITEMS[: spec.num_items])
    value = rng.randint(min(2, spec.max_operand), spec.max_operand)
    sentences = [f"{name} has {value} {item}."]
    steps = []
    for i in range(rng.randint(spec.min_ops, spec.max_ops)):
        op, operand = _choose_op(rng, spec, value)
        phrase = rng.choice(PHRASES[op][: spec.num_templates])
        sentence = phrase.format(p=pronoun, n=operand)
        sentences.append(sentence[0].upper() + sentence[1:] if i == 0 else "Then " + sentence)
        result = apply_op(value, op, operand)
        steps.append(format_step(value, op, operand, result))
        value = result
    sentences.append(f"How many {item} does {name} have?")
    return {
        "question": " ".join(sentences),
        "steps": steps,
        "answer": solution_text(steps, value),
        "final": str(value),
    }


def sloppy_result(value: int, op: str, operand: int) -> int:
    """The result a solver gets who adds and subtracts digit by digit, dropping carries and
    borrows (each digit of a difference is |a - b|); multiplication is done right."""
    if op == "*":
        return value * operand
    a, b = str(value), str(operand)
    width = max(len(a), len(b))
    a, b = a.zfill(width), b.zfill(width)
    digits = [(int(x) + int(y)) % 10 if op == "+" else abs(int(x) - int(y)) for x, y in zip(a, b)]
    return int("".join(map(str, digits)))


def sloppy_solution(problem: dict) -> str:
    """The problem's worked solution as the sloppy solver writes it (consistent with its own slips)."""
    parsed = [parse_step(step) for step in problem["steps"]]
    value, steps = parsed[0][0], []
    for _, op, operand in parsed:
        result = sloppy_result(value, op, operand)
        steps.append(format_step(value, op, operand, result))
        value = result
    return solution_text(steps, value)


def make_splits(spec: TaskSpec) -> tuple[list[dict], list[dict]]:
    """Deterministic (train_rows, test_rows); every question is unique across both splits."""
    rng = random.Random(spec.seed)
    wanted = spec.num_test + spec.num_train
    seen: set[str] = set()
    rows: list[dict] = []
    attempts = 0
    while len(rows) < wanted:
        attempts += 1
        if attempts > 20 * wanted + 1000:
            raise ValueError(f"task too small for {wanted} distinct problems; raise max_operand or max_ops")
        problem = make_problem(rng, spec)
        if problem["question"] not in seen:
            seen.add(problem["question"])
            rows.append(problem)
    train, test = rows[spec.num_test :], rows[: spec.num_test]
    if spec.demo_slip_rate > 0:
        slip_rng = random.Random(spec.seed + 1)
        train = [{**r, "answer": sloppy_solution(r)} if slip_rng.random() < spec.demo_slip_rate else r
                 for r in train]
    return train, test


def parse_step(step: str) -> tuple[int, str, int]:
    """Split a line "a<op>b=c" into (a, op, b)."""
    lhs = step.split("=")[0]
    for i, ch in enumerate(lhs[1:], start=1):
        if ch in PHRASES:
            return int(lhs[:i]), ch, int(lhs[i + 1 :])
    raise ValueError(f"not a step line: {step!r}")


def _slip(rng: random.Random, correct: int) -> int:
    """A plausible wrong result near `correct` (off by one or two, or by ten), never negative."""
    while True:
        wrong = correct + rng.choice([-10, -2, -1, 1, 2, 10])
        if wrong >= 0:
            return wrong


def corrupt_steps(problem: dict, rng: random.Random) -> tuple[list[str], int]:
    """Put an arithmetic slip into one step and carry the wrong value through the later steps.

    Returns the new reasoning lines and the index of the first wrong one. Because later steps only
    add, subtract or multiply by >= 2, the final value differs from the correct one. A subtraction
    that would go negative after the slip is re-drawn (the slip changes, not the operand).
    """
    parsed = [parse_step(step) for step in problem["steps"]]
    first_wrong = rng.randrange(len(parsed))
    for _ in range(100):
        value = parsed[0][0]
        steps = []
        for i, (_, op, operand) in enumerate(parsed):
            result = apply_op(value, op, operand)
            if i == first_wrong:
                result = _slip(rng, result)
            steps.append(format_step(value, op, operand, result))
            value = result
            if value < 0:
                break
        else:
            return steps, first_wrong
    raise ValueError(f"could not corrupt problem {problem['question']!r}")


def final_of(steps: list[str]) -> int:
    """The value after the last reasoning line."""
    return int(steps[-1].split("=")[-1])


def preference_rows(problems: list[dict], seed: int) -> list[dict]:
    """One `{question, chosen, rejected}` per problem: the correct vs. a corrupted solution."""
    rng = random.Random(seed)
    rows = []
    for problem in problems:
        wrong, _ = corrupt_steps(problem, rng)
        rows.append({
            "question": problem["question"],
            "chosen": solution_text(problem["steps"], problem["final"]),  # correct even when the demo slipped
            "rejected": solution_text(wrong, final_of(wrong)),
        })
    return rows


def step_label_rows(problems: list[dict], seed: int, frac_correct: float = 0.5) -> list[dict]:
    """Process-supervision rows `{question, steps, labels}`, one per problem.

    The final `#### n` is a step of its own. A fraction `frac_correct` of the solutions (drawn at
    random) stays correct, with all labels 1. The others are corrupted: steps before the first wrong
    one are labelled 1, the wrong step and every later one 0, which is Math-Shepherd's hard estimate
    (from a wrong intermediate value no continuation reaches the gold answer).
    """
    rng = random.Random(seed)
    rows = []
    for problem in problems:
        if rng.random() < frac_correct:
            steps, first_wrong = list(problem["steps"]), len(problem["steps"]) + 1
        else:
            steps, first_wrong = corrupt_steps(problem, rng)
        steps = steps + [f"#### {final_of(steps)}"]
        labels = [1 if i < first_wrong else 0 for i in range(len(steps))]
        rows.append({"question": problem["question"], "steps": steps, "labels": labels})
    return rows
