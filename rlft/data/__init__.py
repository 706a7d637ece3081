"""Data: the built-in synthetic task and character tokenizer, loading, prompt formatting, encoding.

    rows = load_rows("data/train.jsonl")                      # or a directory, or a hub id
    rows = map_fields(rows, {"answer": "solution"}, ["question", "answer"], "data/train.jsonl")
    for row in to_sft_rows(rows):
        example = encode_sft(tok, render_prompt(tok, row["prompt"]), row["response"], max_len=256)
"""

from .encode import collate_padded, encode_pair, encode_prompt, encode_sft, encode_steps, pad_to
from .formatting import DEFAULT_TEMPLATE, render_prompt
from .loading import DataError, load_rows, map_fields, to_preference_rows, to_sft_rows, to_step_rows
from .synthetic import TaskSpec, corrupt_steps, make_problem, make_splits, preference_rows, step_label_rows
from .tokenizer import build_char_tokenizer

__all__ = [
    "DEFAULT_TEMPLATE",
    "DataError",
    "TaskSpec",
    "build_char_tokenizer",
    "collate_padded",
    "corrupt_steps",
    "encode_pair",
    "encode_prompt",
    "encode_sft",
    "encode_steps",
    "load_rows",
    "make_problem",
    "make_splits",
    "map_fields",
    "pad_to",
    "preference_rows",
    "render_prompt",
    "step_label_rows",
    "to_preference_rows",
    "to_sft_rows",
    "to_step_rows",
]
