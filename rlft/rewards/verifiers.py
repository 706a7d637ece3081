"""Rule-based math verifiers: answer extraction, normalisation, and rule reward functions.

The answer check itself belongs to the environment (rlft/envs/math.py builds on these functions);
`reward.functions=[correctness]` is the environment's outcome reward.

Reward functions follow the user reward signature

    fn(prompts: list[str], completions: list[str], **row_fields) -> list[float]

where row_fields are the dataset columns of each row, as lists aligned with
`completions` (e.g. `answer=[...]` for GSM8K).

Final answers are recognised in two forms:
  * GSM8K: `#### <answer>` -- the text after the LAST `####`, up to the end of that line;
  * LaTeX: `\\boxed{...}` -- the LAST occurrence, with balanced (nested) braces.
When both appear, the one that occurs later in the text wins.
"""

from __future__ import annotations

import re
from decimal import Decimal, localcontext
from fractions import Fraction

from rlft.registry import Registry

REWARD_FUNCTIONS = Registry("reward function")

_BOXED = "\\boxed"
_NUMBER = re.compile(r"[+-]?(\d+(\.\d*)?|\.\d+)")
_FRACTION = re.compile(r"([+-]?\d+)/([+-]?\d+)")
_THOUSANDS = re.compile(r"(?<=\d),(?=\d{3}(\D|$))")
_LATEX_FRAC = re.compile(r"\\[dt]?frac\{([^{}]*)\}\{([^{}]*)\}")


def _extract_hash(text: str) -> tuple[int, str | None]:
    """(position, answer) of the last `####` answer, or (-1, None)."""
    pos = text.rfind("####")
    if pos < 0:
        return -1, None
    line = text[pos + 4 :].split("\n", 1)[0].strip()
    return pos, line or None


def _extract_boxed(text: str) -> tuple[int, str | None]:
    """(position, content) of the last balanced `\\boxed{...}`, or (-1, None)."""
    pos = text.rfind(_BOXED + "{")
    while pos >= 0:
        depth, start = 0, pos + len(_BOXED)
        for i in range(start, len(text)):
            if text[i] == "{":
                depth += 1
            elif text[i] == "}":
                depth -= 1
                if depth == 0:
                    content = text[start + 1 : i].strip()
                    return pos, content or None
        pos = text.rfind(_BOXED + "{", 0, pos)  # unbalanced: try an earlier one
    return -1, None


def extract_answer(text: str | None) -> str | None:
    """The final answer of a solution (raw, not normalised), or None if there is none."""
    if not text:
        return None
    hash_pos, hash_ans = _extract_hash(text)
    boxed_pos, boxed_ans = _extract_boxed(text)
    if hash_ans is not None and (boxed_ans is None or hash_pos > boxed_pos):
        return hash_ans
    return boxed_ans


def parse_number(s: str | None) -> Fraction | None:
    """Exact value of a normalised numeric answer ("1234", "-0.5", "3/4"), else None."""
    if s is None:
        return None
    if _NUMBER.fullmatch(s):
        return Fraction(s)
    m = _FRACTION.fullmatch(s)
    if m and int(m.group(2)) != 0:
        return Fraction(int(m.group(1)), int(m.group(2)))
    return None


def _canonical_number(x: Fraction) -> str:
    """Integers as "n"; terminating decimals as "d.ddd" (no trailing zeros); else "a/b"."""
    if x.denominator == 1:
        return str(x.numerator)
    den = x.denominator
    for p in (2, 5):
        while den % p == 0:
            den //= p
    if den != 1:
        return f"{x.numerator}/{x.denominator}"
    with localcontext() as ctx:
        ctx.prec = 100
        text = format(Decimal(x.numerator) / Decimal(x.denominator), "f")
    return text.rstrip("0").rstrip(".")


def normalize_answer(s: str | None) -> str | None:
    """Canonical form of an answer string, so equal answers compare equal.

    Strips whitespace, `$` and `\\$`, `\\text{...}` wrappers, a trailing '.',
    thousands commas ("1,234" -> "1234"), a leading '+', and rewrites
    `\\frac{a}{b}` as a/b. A number is rewritten canonically: "3.0" -> "3",
    "-0" -> "0", "0.50" -> "0.5", "2/4" -> "1/2", "1/2" -> "0.5". Other text is
    returned with whitespace removed. None or empty gives None.
    """
    if s is None:
        return None
    s = re.sub(r"\\text\{([^{}]*)\}", r"\1", s)
    s = s.replace("\\$", "").replace("$", "").replace("\\!", "").replace("\\,", "")
    s = "".join(s.split())
    s = s.rstrip(".")
    s = _THOUSANDS.sub("", s)
    s = _LATEX_FRAC.sub(r"(\1)/(\2)", s)
    s = re.sub(r"\((-?\d+)\)/\((-?\d+)\)", r"\1/\2", s)
    value = parse_number(s)
    if value is not None:
        return _canonical_number(value)
    return s or None


def answers_match(pred: str | None, gold: str | None) -> bool:
    """True when both answers normalise to the same value: numbers compare
    exactly as rationals ("0.50" == "1/2"), other answers as normalised text."""
    p, g = normalize_answer(pred), normalize_answer(gold)
    if p is None or g is None:
        return False
    pv, gv = parse_number(p), parse_number(g)
    if pv is not None and gv is not None:
        return pv == gv
    return p == g


def gold_answer(answer: str) -> str | None:
    """The gold answer of a dataset row: the `####`/boxed answer of a full
    solution (GSM8K `answer` column), or the value itself when it is bare."""
    extracted = extract_answer(answer)
    return extracted if extracted is not None else (answer.strip() or None)


_FINAL_HASH_LINE = re.compile(r"####[ \t]*([^\n]*?)[ \t]*\Z")


@REWARD_FUNCTIONS.register("format")
def format_reward(prompts: list[str], completions: list[str], **row_fields) -> list[float]:
    """1.0 when the completion ends with exactly one `#### <number>` final answer
    (only whitespace after it, and no other `####`), else 0.0."""
    rewards = []
    for c in completions:
        text = c.rstrip()
        m = _FINAL_HASH_LINE.search(text)
        ok = text.count("####") == 1 and m is not None and parse_number(normalize_answer(m.group(1))) is not None
        rewards.append(float(ok))
    return rewards
