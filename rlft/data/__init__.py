"""Data: the built-in synthetic task and character tokenizer, loading, prompt formatting, encoding.

    rows = load_rows("data/train.jsonl")                      # or a directory, or a hub id
    rows = map_fields(rows, {"answer": "solution"}, ["question", "answer"], "data/train.jsonl")
    for row in to_sft_rows(rows):
        example = encode_sft(tok, render_prompt(tok, row["prompt"]), row["response"], max_len=256)

Names are imported lazily, so `import rlft.data.synthetic` (used by the config schema) does not
pull in torch or transformers.
"""

import importlib

_EXPORTS = {
    "encode": ["collate_padded", "encode_pair", "encode_prompt", "encode_sft", "encode_steps", "pad_to"],
    "formatting": ["DEFAULT_TEMPLATE", "render_prompt"],
    "loading": ["DataError", "load_rows", "map_fields", "to_preference_rows", "to_sft_rows", "to_step_rows"],
    "synthetic": ["TaskSpec", "corrupt_steps", "make_problem", "make_splits", "preference_rows", "step_label_rows"],
    "tokenizer": ["build_char_tokenizer"],
}
_MODULE_OF = {name: module for module, names in _EXPORTS.items() for name in names}
__all__ = sorted(_MODULE_OF)


def __getattr__(name: str):
    if name not in _MODULE_OF:
        raise AttributeError(f"module 'rlft.data' has no attribute {name!r}")
    return getattr(importlib.import_module(f".{_MODULE_OF[name]}", __name__), name)


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
