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

from rlft import handoff
from rlft.data.encode import collate_padded, encode_steps, pad_to
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


def check_sources(cfg) -> None:
    """Every configured source exists (user functions are imported; models are not loaded): a
    one-line UnknownNameError before anything is started or removed."""
    for name in source_weights(list(cfg.reward.functions), list(cfg.reward.weights)):
        if name not in MODEL_SOURCES and name != ENV_SOURCE and name not in REWARD_FUNCTIONS.names():
            load_user_function(name)


class RewardSet:
    """The configured reward sources, their weights, and the models they need; `correctness` is the
    environment's outcome reward."""

    def __init__(self, cfg, device: torch.device, env=None):
        self.weights = source_weights(list(cfg.reward.functions), list(cfg.reward.weights))
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

    @staticmethod
    def load_model(cfg, kind: str, device: torch.device) -> ScoringModel:
        ref = cfg.reward.rm_path if kind == "rm" else cfg.reward.prm_path
        return ScoringModel(cfg, kind, handoff.resolve_model_path(cfg, ref), device)

    def __call__(self, prompts: list, prompt_texts: list[str], completions: list[str],
                 rows: list[dict]) -> tuple[torch.Tensor, dict[str, list[float]]]:
        """(weighted total [N] float64, {source: per-completion values})."""
        fields = {k: [r.get(k) for r in rows] for k in (rows[0].keys() if rows else [])
                  if k != "prompt" and not k.startswith("_")}
        per_source: dict[str, list[float]] = {}
        if self.env is not None:
            per_source[ENV_SOURCE] = [s.reward for s in self.env.scores(rows, completions)]
        for name, fn in self.fns.items():
            values = [float(v) for v in fn(prompts, completions, **fields)]
            if len(values) != len(completions):
                raise ValueError(f"reward '{name}' returned {len(values)} values for {len(completions)} completions")
            per_source[name] = values
        for name, model in self.models.items():
            per_source[name] = model.outcome(prompt_texts, completions)
        total = torch.zeros(len(completions), dtype=torch.float64)
        per_source = {name: per_source[name] for name in self.weights}  # the configured order
        for name, values in per_source.items():
            total += self.weights[name] * torch.tensor(values, dtype=torch.float64)
        return total, per_source
