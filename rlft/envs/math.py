"""`env=math`: one completion, one final answer (the built-in task, GSM8K-format files).

The rows come from `data.*` (the built-in task or the user's file / dataset). A completion's final
answer is the text after its last `####` or its last `\\boxed{}`; it is correct when it equals the
gold answer:
  * plain numbers ("1,234", "0.50", "3/4") compare exactly as rationals (rlft.rewards.verifiers);
  * anything else (LaTeX, fractions, expressions, intervals) through Hugging Face's math-verify,
    where `env.verifier` is `auto` (the default) or `math_verify`; `exact` compares normalised text.
"""
from __future__ import annotations

from rlft.data import labels
from rlft.data.loading import DataError
from rlft.envs.base import Environment, Score
from rlft.rewards import verifiers as V

VERIFIERS = ("auto", "exact", "math_verify")


def math_verify_equal(pred: str, gold: str) -> bool:
    """math-verify's equivalence of two answers (LaTeX or plain), False when it cannot parse one."""
    try:
        from math_verify import parse, verify
    except ImportError as err:  # a dependency of rlft; a broken install says so
        raise RuntimeError(f"env.verifier needs math-verify ({err}); pip install math-verify") from None

    def parsed(text: str):
        text = text.strip()
        return parse(text if "$" in text or "\\(" in text else f"${text}$")

    try:
        g, p = parsed(gold), parsed(pred)
        return bool(g) and bool(p) and bool(verify(g, p))
    except Exception:  # math-verify's own parse or timeout failures: not equal
        return False


def answers_equal(pred: str | None, gold: str | None, verifier: str = "auto") -> bool:
    """Equality of a predicted and a gold answer under `verifier` (exact | math_verify | auto)."""
    if pred is None or gold is None:
        return False
    if verifier == "math_verify":
        return math_verify_equal(pred, gold)
    if V.answers_match(pred, gold):
        return True
    numeric = V.parse_number(V.normalize_answer(pred)) is not None and V.parse_number(V.normalize_answer(gold)) is not None
    return verifier == "auto" and not numeric and math_verify_equal(pred, gold)


class MathEnv(Environment):
    """The data's question/answer rows, judged by their final answer."""

    name = "math"
    options_read = ("verifier",)

    def __init__(self, cfg):
        super().__init__(cfg)
        if cfg.env.verifier not in VERIFIERS:
            raise ValueError(f"env.verifier={cfg.env.verifier!r} is not valid; choose one of: {', '.join(VERIFIERS)}")
        self.verifier = str(cfg.env.verifier)
        self._rows: dict[str, list[dict]] = {}

    def rows(self, split: str) -> list[dict]:
        from rlft.stages import inputs

        if split not in self._rows:
            self._rows[split] = inputs.qa_rows(self.cfg, split)
        return self._rows[split]

    def check_rows(self, rows: list[dict], name: str) -> int:
        """Rows whose gold answer cannot be checked (blank, or a worked solution with no final answer):
        a DataError naming the first, or with data.allow_unverifiable a count."""
        from rlft.data import loading

        bad = [loading.row_number(r, i) for i, r in enumerate(rows, start=1)
               if V.extract_answer(str(r.get("answer") or "")) is None
               and (not str(r.get("answer") or "").strip() or "\n" in str(r.get("answer")).strip())]
        if bad and not self.cfg.data.allow_unverifiable:
            raise DataError(f"{name} row {bad[0]}: its answer has no final answer to check ('#### <n>' or "
                            f"\\boxed{{n}}; {len(bad)} such rows); fix the data or set data.allow_unverifiable=true "
                            "(their correctness is then 0)")
        if bad:
            print(f"[rlft] {name}: {len(bad)} row(s) without a checkable final answer (correctness 0)", flush=True)
        return len(bad)

    def gold(self, row: dict) -> str | None:
        return V.gold_answer(str(row.get("answer", "")))

    def score(self, row: dict, completion: str) -> Score:
        pred = V.extract_answer(completion)
        ok = answers_equal(pred, V.gold_answer(str(row.get("answer", ""))), self.verifier)
        return Score(reward=float(ok), correct=ok, answer=V.normalize_answer(pred))

    def step_labels(self, row: dict, steps: list[str]) -> list[int]:
        if "response" not in row:
            raise NotImplementedError("exact step labels need the row's worked solution (`response`)")
        gold = V.gold_answer(str(row["answer"]))
        return labels.exact_step_labels(steps, labels.worked_steps(row["response"]),
                                        lambda line: answers_equal(V.extract_answer(line), gold, self.verifier))
