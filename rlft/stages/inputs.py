"""Config -> training examples: the built-in task or the user's data, rendered and tokenised.

Every stage asks for rows of one shape (question/answer, preference pairs, step labels); the
built-in task generates them, user data is loaded from a file or the hub and mapped to the
canonical field names. Errors name the file, the row and the field.
"""
from __future__ import annotations

import dataclasses
import random
from functools import lru_cache
from pathlib import Path

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


def single_file(cfg) -> bool:
    """The data is one local file (or one Dataset saved by `datasets`): no splits of its own, so the test split is
    carved from it."""
    if is_builtin(cfg):
        return False
    path = Path(cfg.data.source).expanduser()
    return path.is_file() or (path.is_dir() and loading.saved_by_datasets(path) == "dataset")


def held_out_indices(num_rows: int, fraction: float, seed: int) -> set[int]:
    """The rows of a single file held out as its test split: a seeded choice of round(fraction x n)
    rows, at least one (none when the file has a single row)."""
    if num_rows < 2:
        return set()
    count = min(num_rows - 1, max(1, round(fraction * num_rows)))
    return set(random.Random(seed).sample(range(num_rows), count))


def data_description(cfg) -> dict:
    """What the stage trained and was evaluated on (for its manifest)."""
    data = cfg.data
    out = {"source": data.source}
    if single_file(cfg):
        out["held_out"] = f"seeded {data.held_out_fraction:g} of the file's rows (data.split_seed={data.split_seed})"
    return out


_SAID: set = set()


def user_rows(cfg, split: str) -> tuple[list[dict], str]:
    """(rows with canonical field names, a name for error messages). A single file is split into
    train and held-out rows; an empty training split is an error."""
    data = cfg.data
    if single_file(cfg):
        rows = loading.load_rows(data.source)
        held = held_out_indices(len(rows), data.held_out_fraction, data.split_seed)
        rows = [r for i, r in enumerate(rows) if (i in held) == (split == "test")]
        name = f"{data.source} [{split}]"
        if data.source not in _SAID:
            _SAID.add(data.source)
            print(f"[rlft] {data.source} has no splits of its own: {len(held)} of its rows are held out as the "
                  f"test split (data.held_out_fraction={data.held_out_fraction:g}, "
                  f"data.split_seed={data.split_seed})", flush=True)
    else:
        split_name = data.train_split if split == "train" else data.test_split
        rows = loading.load_rows(data.source, split_name, data.name)
        name = f"{data.source} [{split_name}]"
    if split == "train" and not rows:
        raise loading.DataError(f"{name} has no rows")
    fields = {k: v for k, v in OmegaConf.to_container(data.fields, resolve=True).items() if v}
    return loading.map_fields(rows, fields, required=[], source=name), name


def limit(cfg, rows: list, split: str) -> list:
    if split == "train" and cfg.data.max_train_rows:
        return rows[:cfg.data.max_train_rows]
    if split != "train" and cfg.data.max_test_rows:
        return rows[:cfg.data.max_test_rows]
    return rows


def render(cfg, tokenizer, row: dict) -> str:
    """The text the model sees for a row: its prompt, with the tools it may call (`tools`) where it has them. With
    data.special_tokens_in_text=literal it remembers where the row's own text lies (rlft/data/encode.py)."""
    text = formatting.render_prompt(tokenizer, row["prompt"], cfg.data.prompt_template, cfg.data.use_chat_template,
                                    tools=row.get("tools"))
    if cfg.data.special_tokens_in_text == "parse":
        return text
    prompt = row["prompt"]
    user_texts = [prompt] if isinstance(prompt, str) else [str(m.get("content") or "") for m in prompt]
    return encode.literal_prompt(tokenizer, text, user_texts)


# ----------------------------------------------------------------------------- row shapes
def qa_rows(cfg, split: str) -> list[dict]:
    """Rows with `prompt`, `response` (the worked solution) and `answer` (gold, when known)."""
    if is_builtin(cfg):
        rows = [{"prompt": r["question"], "response": r["answer"], "answer": r["final"]}
                for r in builtin_rows(cfg, split)]
    else:
        raw, name = user_rows(cfg, split)
        sft = loading.to_sft_rows(raw, name)
        rows = [{**s, "answer": r.get("answer") or s["response"], loading.ROW: loading.row_number(r, i)}
                for i, (s, r) in enumerate(zip(sft, raw), start=1)]
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


def rows_of(cfg, shape: str, split: str) -> list[dict]:
    """The rows of an AlgoSpec.rows shape (qa, preference, steps)."""
    if shape == "preference":
        return preference_rows(cfg, split)
    if shape == "steps":
        return step_rows(cfg, split, getattr(cfg.algo, "frac_correct", 0.5))
    return qa_rows(cfg, split)


# ----------------------------------------------------------------------------- tokenised examples
def sft_examples(cfg, tokenizer, split: str = "train") -> list[dict]:
    """Prompt + demonstration examples from the environment (env=math: the row's response); one whose
    prompt fills train.max_seq_len (no response token left to learn) is dropped, and counted."""
    from rlft import envs

    env = envs.build(cfg, tokenizer)
    examples = []
    for r in env.rows(split):
        segments = env.demonstration(r)
        prompt_text = render(cfg, tokenizer, r)
        if len(segments) == 1 and segments[0][1]:  # all trained: one encoding of the whole response
            examples.append(encode.encode_sft(tokenizer, prompt_text, segments[0][0], cfg.train.max_seq_len))
        else:
            examples.append(encode.encode_segments(tokenizer, prompt_text, segments, cfg.train.max_seq_len))
    kept = [ex for ex in examples if sum(ex["loss_mask"][1:])]
    if len(kept) < len(examples):
        print(f"[rlft] {split}: dropped {len(examples) - len(kept)} example(s) whose prompt alone fills "
              f"train.max_seq_len={cfg.train.max_seq_len}", flush=True)
    return kept


def check_demonstrations_fit(cfg, tokenizer, rows: list[dict]) -> None:
    """A one-line DataError when no training row's prompt leaves room for a response token in
    train.max_seq_len (every SFT example would be dropped); stops at the first prompt that fits."""
    from rlft.data.loading import DataError

    limit, shortest = cfg.train.max_seq_len, None
    for r in rows:
        n = len(encode.encode_prompt(tokenizer, render(cfg, tokenizer, r)))
        if n < limit:
            return
        shortest = n if shortest is None else min(shortest, n)
    if shortest is not None:
        raise DataError(f"no SFT example fits train.max_seq_len={limit}: every training prompt alone fills it "
                        f"(the shortest has {shortest} tokens); raise train.max_seq_len above {shortest}")


def pair_examples(cfg, tokenizer, split: str = "train") -> list[dict]:
    return [encode.encode_pair(tokenizer, render(cfg, tokenizer, r), r["chosen"], r["rejected"],
                               cfg.train.max_seq_len)
            for r in preference_rows(cfg, split)]


def step_examples(cfg, tokenizer, split: str, frac_correct: float) -> list[dict]:
    out = []
    for r in step_rows(cfg, split, frac_correct):
        ex = encode.encode_steps(tokenizer, render(cfg, tokenizer, r), r["steps"], r["labels"],
                                 cfg.train.max_seq_len)
        if ex["step_positions"]:
            out.append(ex)
    return out
