"""`env=calculator`: GSM8K's calculator as a tool (multi-turn).

GSM8K's solutions annotate every calculation as `<<48/2=24>>`. In this environment the model writes
the call's opening and expression, `<<48/2=`; its turn ends there (the stop string `=`), the
environment evaluates `48/2` with a small arithmetic parser (`evaluate`: numbers, + - * /, unary
signs and parentheses; never Python's `eval`) and appends `24>>` as environment tokens, which carry
no loss; the model goes on from there. A `=` outside an open call is ordinary text.

Rows, the final-answer check and its options are env=math's. Demonstrations for SFT come from the
row's worked solution: `<<expr=result>>` annotations are kept (the result recomputed by the tool), and
plain calculation lines `a+b=c` (the built-in task) become calls whose results the tool supplies; a
later line that starts from the written value of the line before starts from the tool's instead, so
the demonstration is what a solver using the calculator would write. Tool results are not trained.
"""
from __future__ import annotations

import re
from fractions import Fraction

from rlft.envs.base import Reply
from rlft.envs.math import MathEnv

MAX_EXPRESSION_CHARS = 200
MAX_DIGITS = 30  # per number; with the operators allowed, results stay small enough to print
_TOKEN = re.compile(r"\s*(?:(\d+(?:\.\d*)?|\.\d+)|(.))")
CALL = re.compile(r"<<([^<>=]*)=([^<>]*)>>")
PLAIN_LINE = re.compile(r"([-+*/().\d\s]*\d[-+*/().\d\s]*?)\s*=\s*(-?\d+(?:\.\d+)?)")
OPEN_CALL = re.compile(r"<<([^<>=]*)=\Z")


class CalcError(ValueError):
    """An expression the calculator cannot evaluate (the message says why)."""


def tokenize(expr: str) -> list[str]:
    if len(expr) > MAX_EXPRESSION_CHARS:
        raise CalcError(f"expression longer than {MAX_EXPRESSION_CHARS} characters")
    tokens = []
    for number, other in _TOKEN.findall(expr.replace(",", "")):
        if number:
            if len(number.replace(".", "")) > MAX_DIGITS:
                raise CalcError(f"a number has more than {MAX_DIGITS} digits")
            tokens.append(number)
        elif other.strip():
            if other not in "+-*/()":
                raise CalcError(f"unexpected character {other!r}")
            tokens.append(other)
    return tokens


class _Parser:
    """expr := term (('+'|'-') term)*;  term := unary (('*'|'/') unary)*;
    unary := ('+'|'-') unary | atom;  atom := number | '(' expr ')'"""

    def __init__(self, tokens: list[str]):
        self.tokens, self.pos = tokens, 0

    def peek(self) -> str | None:
        return self.tokens[self.pos] if self.pos < len(self.tokens) else None

    def take(self) -> str:
        token = self.peek()
        if token is None:
            raise CalcError("the expression ends too early")
        self.pos += 1
        return token

    def expr(self, depth: int = 0) -> Fraction:
        if depth > 32:
            raise CalcError("parentheses nested too deeply")
        value = self.term(depth)
        while self.peek() in ("+", "-"):
            value = value + self.term(depth) if self.take() == "+" else value - self.term(depth)
        return value

    def term(self, depth: int) -> Fraction:
        value = self.unary(depth)
        while self.peek() in ("*", "/"):
            op, right = self.take(), self.unary(depth)
            if op == "/" and right == 0:
                raise CalcError("division by zero")
            value = value * right if op == "*" else value / right
        return value

    def unary(self, depth: int) -> Fraction:
        if self.peek() in ("+", "-"):
            sign = self.take()
            return self.unary(depth + 1) * (-1 if sign == "-" else 1)
        return self.atom(depth)

    def atom(self, depth: int) -> Fraction:
        token = self.take()
        if token == "(":
            value = self.expr(depth + 1)
            if self.peek() != ")":
                raise CalcError("a parenthesis is not closed")
            self.take()
            return value
        if token in "+-*/)":
            raise CalcError(f"unexpected {token!r}")
        return Fraction(token)


def evaluate(expr: str) -> Fraction:
    """The exact value of an arithmetic expression; CalcError when it is not one."""
    tokens = tokenize(expr)
    if not tokens:
        raise CalcError("empty expression")
    parser = _Parser(tokens)
    value = parser.expr()
    if parser.peek() is not None:
        raise CalcError(f"unexpected {parser.peek()!r}")
    return value


def format_number(value: Fraction) -> str:
    """Integers as such; other values as decimals rounded to 6 places, trailing zeros dropped."""
    if value.denominator == 1:
        return str(value.numerator)
    text = f"{float(value):.6f}".rstrip("0").rstrip(".")
    return "0" if text in ("-0", "") else text


def calculate(expr: str) -> tuple[str, str | None]:
    """(the tool's output, the error or None): the formatted value, or `?` when it cannot evaluate."""
    try:
        return format_number(evaluate(expr)), None
    except (CalcError, ZeroDivisionError, ValueError) as err:
        return "?", str(err)


def with_calls(text: str) -> str:
    """A worked solution with its plain calculation lines (`a+b=c`) written as calculator calls, the
    results the tool's: a line that starts from the previous line's written value starts from the
    tool's value instead, and so does a final `#### v` that repeats it."""
    out, written, actual = [], None, None
    for line in text.split("\n"):
        m = PLAIN_LINE.fullmatch(line.strip())
        if m:
            expr = m.group(1).strip()
            if written is not None and expr.startswith(written) and not expr[len(written):len(written) + 1].isdigit():
                expr = actual + expr[len(written):]
            result, _ = calculate(expr)
            out.append(f"<<{expr}={result}>>")
            written, actual = m.group(2), result
        elif line.strip().startswith("####") and written is not None and line.strip()[4:].strip() == written:
            out.append(f"#### {actual}")
        else:
            out.append(line)
    return "\n".join(out)


class CalculatorEnv(MathEnv):
    """env=math's rows and answer check, with GSM8K's calculator as a tool."""

    name = "calculator"
    stop = ("=",)
    max_turns = 8

    def step(self, row: dict, transcript: str) -> Reply:
        m = OPEN_CALL.search(transcript[-(MAX_EXPRESSION_CHARS + 3):])
        if not m:  # an '=' that opens no call: the model's turn goes on
            return Reply()
        result, error = calculate(m.group(1))
        return Reply(text=f"{result}>>", error=error, tool_call=True)

    def demonstration(self, row: dict) -> list[tuple[str, bool]]:
        text = str(row["response"])
        if "<<" not in text:
            text = with_calls(text)
        segments, pos = [], 0
        for m in CALL.finditer(text):
            result, error = calculate(m.group(1))
            segments.append((text[pos:m.start()] + f"<<{m.group(1)}=", True))
            segments.append(((m.group(2) if error else result) + ">>", False))
            pos = m.end()
        segments.append((text[pos:], True))
        return [(t, trained) for t, trained in segments if t]

    def step_labels(self, row: dict, steps: list[str]) -> list[int]:
        """env=math's exact labels on the steps with their calls unwrapped (`<<a+b=c>>` reads `a+b=c`)."""
        return super().step_labels(row, [CALL.sub(r"\1=\2", s) for s in steps])
