"""Rewards for RL: rule verifiers, the RM stage's model, the PRM stage's model, user functions.

`reward.functions` lists the sources and `reward.weights` their weights, e.g.
reward.functions=[correctness,format] reward.weights=[1.0,0.1], or reward=rm. A source is `correctness` (the
environment's outcome reward: env=math checks the final answer, env=reasoning_gym asks the task's scorer),
a built-in rule (`format`), `rm` (this run's outcome
reward model, or reward.rm_path), `prm` (the process reward model: its solution score is the
minimum step probability, §2.2), or `package.module:function` with the signature

    fn(prompts: list[str], completions: list[str], **row_fields) -> list[float]

The total is the weighted sum; every source is also returned on its own for logging.
Process supervision (GRPO `advantage=grpo_process`) additionally asks the PRM for the score
of every step, with each step's last character, which the RL stage maps to policy tokens.
"""
from __future__ import annotations

from typing import Callable

import torch

from rlft.algos.preference import solution_score_min
from rlft.data.encode import collate_padded, encode_steps, pad_to
from rlft.errors import RewardError
from rlft.model_source import resolve_model_path
from rlft.models import last_token_index, load_model, load_tokenizer, token_scores
from rlft.registry import UnknownNameError, import_path
from rlft.rewards.verifiers import REWARD_FUNCTIONS

MODEL_SOURCES = ("rm", "prm")
ENV_SOURCE = "correctness"  # the environment's own outcome reward


def split_steps(text: str) -> tuple[list[str], list[int]]:
    """Reasoning steps of a completion (its non-empty lines) and each step's end offset (exclusive)."""
    steps, ends, start = [], [], 0
    for line in text.split("\n"):
        stripped = line.rstrip()
        if stripped.strip():
            steps.append(stripped)
            ends.append(start + len(stripped))
        start += len(line) + 1
    return steps, ends


WAIT_NOTICE_S = 5.0  # a call longer than this says, every WAIT_NOTICE_S x 2, what the run waits on


def call_with_notice(name: str, call: Callable[[], object], timeout_s: float) -> object:
    """call() in a helper thread: after WAIT_NOTICE_S the console says what the run waits on; past timeout_s a
    RewardError (the call may go on in the background; the run stops)."""
    import threading
    import time

    box: dict = {}
    done = threading.Event()

    def target():
        try:
            box["value"] = call()
        except BaseException as exc:  # noqa: BLE001 - reported to the caller below
            box["error"] = exc
        done.set()

    threading.Thread(target=target, name=f"reward {name}", daemon=True).start()
    tic, notice = time.time(), WAIT_NOTICE_S
    while not done.wait(min(notice, timeout_s) - (time.time() - tic)):
        waited = time.time() - tic
        if waited >= timeout_s:
            raise RewardError(f"reward '{name}' did not return within reward.timeout_s={timeout_s:g} s; make it "
                              "faster or raise reward.timeout_s")
        if waited >= notice:
            print(f"[rlft] waiting on reward {name}, {waited:.0f} s", flush=True)
            notice *= 2
    if "error" in box:
        exc = box["error"]
        raise RewardError(f"reward '{name}' raised {type(exc).__name__}: {exc}") from exc
    return box["value"]


def checked_values(name: str, raw, count: int, nonfinite: str = "error") -> tuple[list[float], int]:
    """(the values a reward function returned as floats, how many were non-finite and set to 0 under
    nonfinite=zero); RewardError naming the function, the value and the sample otherwise."""
    import math

    rule = f"it must return one finite number per completion ({count} here)"
    if isinstance(raw, (str, bytes, dict)) or not hasattr(raw, "__len__"):
        raise RewardError(f"reward '{name}' returned {type(raw).__name__} {str(raw)[:60]!r}; {rule}")
    if len(raw) != count:
        raise RewardError(f"reward '{name}' returned {len(raw)} values for {count} completions; {rule}")
    values, bad = [], 0
    for i, v in enumerate(raw):
        try:
            if isinstance(v, (str, bytes)) or v is None:
                raise TypeError
            x = float(v)
        except (TypeError, ValueError):
            raise RewardError(f"reward '{name}' returned {type(v).__name__} {str(v)[:60]!r} for sample {i}; "
                              f"{rule}") from None
        if not math.isfinite(x):
            if nonfinite != "zero":
                raise RewardError(f"reward '{name}' returned {x} for sample {i}; {rule} (or set "
                                  "reward.nonfinite=zero to count it as 0)")
            x, bad = 0.0, bad + 1
        values.append(x)
    return values, bad


def load_user_function(spec: str) -> Callable:
    """`package.module:function` -> the function, with a one-line error naming the problem."""
    valid = ", ".join(REWARD_FUNCTIONS.names() + [ENV_SOURCE] + list(MODEL_SOURCES))
    fn, module_name, attr = import_path(spec, "reward", f"{valid} or an import path 'package.module:function'")
    if not callable(fn):
        raise UnknownNameError(f"reward '{spec}': {module_name} has no function {attr}")
    return fn


class ScoringModel:
    """A frozen RM or PRM (the stage's HF directory) that scores prompt + completion texts."""

    def __init__(self, cfg, kind: str, path: str, device: torch.device, micro_batch: int = 32):
        self.kind, self.device, self.micro_batch, self.path = kind, device, micro_batch, path
        new_tokens = max(cfg.rollout.max_new_tokens, cfg.eval.max_new_tokens)
        self.max_len = cfg.train.max_seq_len + new_tokens
        self.tokenizer = load_tokenizer(cfg.model, path)
        self.use(load_model(cfg.model, path, self.tokenizer, head=kind))

    def use(self, model: torch.nn.Module) -> None:
        """Score with `model` from now on (e.g. iterative RL's retrained copy): frozen, in eval mode."""
        self.model = model.to(self.device).eval()
        self.model.requires_grad_(False)

    def _encode(self, prompt_text: str, completion: str) -> list[int]:
        tok = self.tokenizer
        ids = tok(prompt_text, add_special_tokens=False)["input_ids"]
        ids += tok(completion, add_special_tokens=False)["input_ids"] + [tok.eos_token_id]
        return ids[-self.max_len:]

    @torch.no_grad()
    def outcome(self, prompt_texts: list[str], completions: list[str]) -> list[float]:
        """RM: the scalar at the last token. PRM: the minimum step probability (solution score)."""
        if self.kind == "prm":
            return [float(solution_score_min(torch.tensor(s))) if s else 0.0
                    for s in self.steps(prompt_texts, completions)[0]]
        seqs = [self._encode(p, c) for p, c in zip(prompt_texts, completions)]
        out: list[float] = []
        for i in range(0, len(seqs), self.micro_batch):
            ids, attn = collate_padded(seqs[i:i + self.micro_batch], self.tokenizer.pad_token_id)
            ids, attn = ids.to(self.device), attn.to(self.device)
            scores = token_scores(self.model, ids, attn)
            out += scores.gather(1, last_token_index(attn)[:, None]).squeeze(1).tolist()
        return out

    @torch.no_grad()
    def steps(self, prompt_texts: list[str], completions: list[str],
              rows: list[dict] | None = None) -> tuple[list[list[float]], list[list[int]]]:
        """PRM step probabilities and each step's end offset in its completion text (`rows` unused)."""
        encoded, char_ends = [], []
        for p, c in zip(prompt_texts, completions):
            steps, ends = split_steps(c)
            ex = encode_steps(self.tokenizer, p, steps or [" "], [0] * max(len(steps), 1), self.max_len) \
                if steps else {"input_ids": self._encode(p, c), "step_positions": []}
            encoded.append(ex)
            char_ends.append(ends[:len(ex["step_positions"])])
        probs: list[list[float]] = []
        for i in range(0, len(encoded), self.micro_batch):
            chunk = encoded[i:i + self.micro_batch]
            ids, attn = collate_padded([ex["input_ids"] for ex in chunk], self.tokenizer.pad_token_id)
            scores = torch.sigmoid(token_scores(self.model, ids.to(self.device), attn.to(self.device)))
            positions = pad_to([ex["step_positions"] or [0] for ex in chunk], 0).to(self.device)
            picked = scores.gather(1, positions).tolist()
            probs += [row[:len(ex["step_positions"])] for row, ex in zip(picked, chunk)]
        return probs, char_ends


class ExactSteps:
    """The environment's exact step labels as a process reward (`reward.process=exact`; the built-in
    task: a step scores 1 while every step so far equals the row's worked solution, and an answer line
    when its answer is right), else 0 -- the labels a perfect PRM would give (docs/algorithms.md §2)."""

    def __init__(self, env):
        self.env = env

    def steps(self, prompt_texts: list[str], completions: list[str],
              rows: list[dict]) -> tuple[list[list[float]], list[list[int]]]:
        scores, char_ends = [], []
        for completion, row in zip(completions, rows):
            steps, ends = split_steps(completion)
            labels = self.env.step_labels(row, steps)
            scores.append([float(x) for x in labels])
            char_ends.append(ends)
        return scores, char_ends


def source_weights(names: list[str], weights: list[float]) -> dict[str, float]:
    """{source: weight} from reward.functions and reward.weights (empty weights: 1.0 each)."""
    if not names:
        raise UnknownNameError("reward.functions is empty; e.g. reward.functions=[correctness]")
    if weights and len(weights) != len(names):
        raise UnknownNameError(f"reward.weights has {len(weights)} values for {len(names)} reward.functions; "
                               "give one weight per source or none")
    if len(set(names)) != len(names):
        raise UnknownNameError(f"reward.functions lists a source twice: {names}")
    return {str(n): float(w) for n, w in zip(names, weights or [1.0] * len(names))}


def check_sources(cfg, row: dict | None = None) -> None:
    """Every configured source exists (user functions are imported and, given a data row, called once on it
    with an empty completion, their result held to the contract; models are not loaded): a one-line error
    before anything is started or removed."""
    for name in source_weights(list(cfg.reward.functions), list(cfg.reward.weights)):
        if name not in MODEL_SOURCES and name != ENV_SOURCE and name not in REWARD_FUNCTIONS.names():
            fn = load_user_function(name)
            if row is not None:
                fields = {k: [v] for k, v in row.items() if k != "prompt" and not k.startswith("_")}
                prompt = row.get("prompt", "")
                try:
                    raw = call_with_notice(name, lambda: fn([prompt], [""], **fields), float(cfg.reward.timeout_s))
                    checked_values(name, raw, 1, str(cfg.reward.nonfinite))
                except RewardError as exc:
                    raise RewardError(f"{exc} (checked before the run starts, on the first training row and an "
                                      "empty completion)") from None


class RewardSet:
    """The configured reward sources, their weights, and the models they need; `correctness` is the
    environment's outcome reward."""

    def __init__(self, cfg, device: torch.device, env=None):
        self.weights = source_weights(list(cfg.reward.functions), list(cfg.reward.weights))
        self.timeout_s, self.nonfinite = float(cfg.reward.timeout_s), str(cfg.reward.nonfinite)
        self.warned: set[str] = set()  # functions whose non-finite values were reported (reward.nonfinite=zero)
        self.fns: dict[str, Callable] = {}
        self.models: dict[str, ScoringModel] = {}
        self.env = None
        for name in self.weights:
            if name == ENV_SOURCE:
                if env is None:
                    from rlft import envs

                    env = envs.build(cfg)
                self.env = env
            elif name in MODEL_SOURCES:
                self.models[name] = self.load_model(cfg, name, device)
            elif name in REWARD_FUNCTIONS.names():
                self.fns[name] = REWARD_FUNCTIONS.get(name)
            else:
                self.fns[name] = load_user_function(name)

    def env_rewards(self, rows: list[dict], completions: list[str]) -> list[float]:
        """The environment's outcome rewards. A user environment (env.name=package.module:Class) is held to the
        reward functions' contract: one Score with a finite reward per completion, its exceptions and waits
        reported as theirs are (the built-in ones are rlft's own code)."""
        if type(self.env).__module__.startswith("rlft."):
            return [s.reward for s in self.env.scores(rows, completions)]
        name = f"{type(self.env).__module__}:{type(self.env).__name__}.scores"
        scores = call_with_notice(name, lambda: self.env.scores(rows, completions), self.timeout_s)
        if isinstance(scores, (list, tuple)):
            scores = [getattr(s, "reward", s) for s in scores]
        return self.checked(name, scores, len(completions))

    def checked(self, name: str, raw, count: int) -> list[float]:
        """A user function's values held to the contract (checked_values); a non-finite value counted as 0
        under reward.nonfinite=zero is said once per function."""
        values, bad = checked_values(name, raw, count, self.nonfinite)
        if bad and name not in self.warned:
            self.warned.add(name)
            print(f"[rlft] reward {name} returned {bad} non-finite value(s), counted as 0 (reward.nonfinite=zero); "
                  "said once", flush=True)
        return values

    @staticmethod
    def load_model(cfg, kind: str, device: torch.device) -> ScoringModel:
        ref = cfg.reward.rm_path if kind == "rm" else cfg.reward.prm_path
        return ScoringModel(cfg, kind, resolve_model_path(cfg, ref), device)

    def __call__(self, prompts: list, prompt_texts: list[str], completions: list[str],
                 rows: list[dict]) -> tuple[torch.Tensor, dict[str, list[float]]]:
        """(weighted total [N] float64, {source: per-completion values})."""
        fields = {k: [r.get(k) for r in rows] for k in (rows[0].keys() if rows else [])
                  if k != "prompt" and not k.startswith("_")}
        per_source: dict[str, list[float]] = {}
        if self.env is not None:
            per_source[ENV_SOURCE] = self.env_rewards(rows, completions)
        for name, fn in self.fns.items():
            raw = call_with_notice(name, lambda fn=fn: fn(prompts, completions, **fields), self.timeout_s)
            per_source[name] = self.checked(name, raw, len(completions))
        for name, model in self.models.items():
            per_source[name] = model.outcome(prompt_texts, completions)
        total = torch.zeros(len(completions), dtype=torch.float64)
        per_source = {name: per_source[name] for name in self.weights}  # the configured order
        for name, values in per_source.items():
            total += self.weights[name] * torch.tensor(values, dtype=torch.float64)
        return total, per_source
