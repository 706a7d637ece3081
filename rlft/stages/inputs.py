"""Config -> training examples: the built-in task or the user's data, rendered and tokenised.

Every stage asks for rows of one shape (question/answer, preference pairs, step labels); the
built-in task generates them, user data is loaded from a file or the hub and mapped to the
canonical field names. Errors name the file, the row and the field.
"""
from __future__ import annotations

import dataclasses
from functools import lru_cache

from omegaconf import OmegaConf

from rlft.data import encode, formatting, loading, synthetic

BUILTIN_TASK = "builtin:arith"


def is_builtin(cfg) -> bool:
    return cfg.data.source == BUILTIN_TASK


def task_spec(cfg) -> synthetic.TaskSpec:
    values = OmegaConf.to_container(cfg.data.task, resolve=True)
    names = {f.name for f in dataclasses.fields(synthetic.TaskSpec)}
    return synthetic.TaskSpec(**{k: v for k, v in values.items() if k in names})


@lru_cache(maxsize=4)
def _builtin_splits(spec_fields: tuple):
    return synthetic.make_splits(synthetic.TaskSpec(*spec_fields))


def builtin_rows(cfg, split: str) -> list[dict]:
    train, test = _builtin_splits(dataclasses.astuple(task_spec(cfg)))
    return train if split == "train" else test


def user_rows(cfg, split: str) -> tuple[list[dict], str]:
    """(rows with canonical field names, a name for error messages)."""
    d = cfg.data
    split_name = d.train_split if split == "train" else d.test_split
    rows = loading.load_rows(d.source, split_name, d.name)
    fields = {k: v for k, v in OmegaConf.to_container(d.fields, resolve=True).items() if v}
    return loading.map_fields(rows, fields, required=[], source=d.source), f"{d.source} [{split_name}]"


def limit(cfg, rows: list, split: str) -> list:
    if split == "train" and cfg.data.max_train_rows:
        return rows[:cfg.data.max_train_rows]
    return rows


def render(cfg, tokenizer, prompt) -> str:
    return formatting.render_prompt(tokenizer, prompt, cfg.data.prompt_template, cfg.data.use_chat_template)


# ----------------------------------------------------------------------------- row shapes
def qa_rows(cfg, split: str) -> list[dict]:
    """Rows with `prompt`, `response` (the worked solution) and `answer` (gold, when known)."""
    if is_builtin(cfg):
        rows = [{"prompt": r["question"], "response": r["answer"], "answer": r["final"]}
                for r in builtin_rows(cfg, split)]
    else:
        raw, name = user_rows(cfg, split)
        sft = loading.to_sft_rows(raw, name)
        rows = [{**s, "answer": r.get("answer", s["response"])} for s, r in zip(sft, raw)]
    return limit(cfg, rows, split)


def preference_rows(cfg, split: str) -> list[dict]:
    if is_builtin(cfg):
        seed = cfg.data.task.seed + (0 if split == "train" else 1)
        rows = [{"prompt": r["question"], "chosen": r["chosen"], "rejected": r["rejected"]}
                for r in synthetic.preference_rows(builtin_rows(cfg, split), seed)]
    else:
        raw, name = user_rows(cfg, split)
        rows = loading.to_preference_rows(raw, name)
    return limit(cfg, rows, split)


def step_rows(cfg, split: str, frac_correct: float) -> list[dict]:
    if is_builtin(cfg):
        seed = cfg.data.task.seed + (0 if split == "train" else 1)
        rows = [{"prompt": r["question"], "steps": r["steps"], "labels": r["labels"]}
                for r in synthetic.step_label_rows(builtin_rows(cfg, split), seed, frac_correct)]
    else:
        raw, name = user_rows(cfg, split)
        rows = loading.to_step_rows(raw, name)
    return limit(cfg, rows, split)


# ----------------------------------------------------------------------------- tokenised examples
def sft_examples(cfg, tokenizer, split: str = "train") -> list[dict]:
    return [encode.encode_sft(tokenizer, render(cfg, tokenizer, r["prompt"]), r["response"], cfg.train.max_seq_len)
            for r in qa_rows(cfg, split)]


def pair_examples(cfg, tokenizer, split: str = "train") -> list[dict]:
    return [encode.encode_pair(tokenizer, render(cfg, tokenizer, r["prompt"]), r["chosen"], r["rejected"],
                               cfg.train.max_seq_len)
            for r in preference_rows(cfg, split)]


def step_examples(cfg, tokenizer, split: str, frac_correct: float) -> list[dict]:
    out = []
    for r in step_rows(cfg, split, frac_correct):
        ex = encode.encode_steps(tokenizer, render(cfg, tokenizer, r["prompt"]), r["steps"], r["labels"],
                                 cfg.train.max_seq_len)
        if ex["step_positions"]:
            out.append(ex)
    return out
