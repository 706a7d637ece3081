"""Tokenising rendered prompts and responses into training examples.

Examples are plain lists of ints; only the collate helpers build tensors. Every response ends with
the tokenizer's EOS token, which is part of the loss (the model must learn to stop). Prompt and
response are tokenised separately and concatenated, so the prompt/response boundary is exact for
any tokenizer. A BOS token is prepended only when the tokenizer itself adds one by default (Llama
style); the built-in character tokenizer adds none. Sequences longer than `max_len` are cut from
the right, which drops the EOS; such examples carry `truncated=True`.
"""

import torch


def _eos_id(tok) -> int:
    if tok.eos_token_id is None:
        raise ValueError("the tokenizer has no eos_token; set one before encoding")
    return tok.eos_token_id


def _adds_bos(tok) -> bool:
    """Whether the tokenizer puts BOS in front of plain text by default."""
    if tok.bos_token_id is None:
        return False
    ids = tok("a", add_special_tokens=True)["input_ids"]
    return bool(ids) and ids[0] == tok.bos_token_id


def encode_prompt(tok, prompt_text: str) -> list[int]:
    """Prompt ids, with BOS in front exactly when the tokenizer adds one by default."""
    ids = tok(prompt_text, add_special_tokens=False)["input_ids"]
    if _adds_bos(tok) and (not ids or ids[0] != tok.bos_token_id):
        ids = [tok.bos_token_id] + ids
    return ids


def prompt_budget(model, max_new_tokens: int) -> int | None:
    """Longest prompt the model can take with room for max_new_tokens (None: no position limit)."""
    limit = getattr(getattr(model, "config", None), "max_position_embeddings", None)
    return max(1, limit - max_new_tokens) if limit else None


def encode_prompts(tok, prompt_texts: list[str], max_len: int | None, what: str = "prompts") -> list[list[int]]:
    """encode_prompt for each text; a prompt longer than max_len keeps its last max_len tokens (the end
    of the question and the answer cue), and how many were cut is said once per call."""
    ids = [encode_prompt(tok, t) for t in prompt_texts]
    if max_len is None:
        return ids
    cut = sum(len(x) > max_len for x in ids)
    if cut:
        print(f"[rlft] {what}: {cut} of {len(ids)} prompt(s) longer than {max_len} tokens (the model's positions "
              f"minus the new tokens) keep their last {max_len} tokens", flush=True)
    return [x[-max_len:] for x in ids]


def _join(prompt_ids: list[int], response_ids: list[int], max_len: int) -> tuple[list[int], list[int], bool]:
    """prompt + response, a loss mask that is 1 on the response, both cut to max_len."""
    ids = prompt_ids + response_ids
    mask = [0] * len(prompt_ids) + [1] * len(response_ids)
    return ids[:max_len], mask[:max_len], len(ids) > max_len


def encode_sft(tok, prompt_text: str, response_text: str, max_len: int) -> dict:
    """`{input_ids, loss_mask, truncated}` for prompt ⊕ response ⊕ EOS; the mask covers response and EOS."""
    response_ids = tok(response_text, add_special_tokens=False)["input_ids"] + [_eos_id(tok)]
    ids, mask, truncated = _join(encode_prompt(tok, prompt_text), response_ids, max_len)
    return {"input_ids": ids, "loss_mask": mask, "truncated": truncated}


def encode_segments(tok, prompt_text: str, segments: list[tuple[str, bool]], max_len: int) -> dict:
    """`{input_ids, loss_mask, truncated}` for prompt ⊕ segments ⊕ EOS, each segment encoded on its own and
    in the loss only when marked trained (a tool's output is context, not a target); EOS is trained."""
    ids, mask = [], []
    for text, trained in segments:
        seg = tok(text, add_special_tokens=False)["input_ids"]
        ids += seg
        mask += [int(trained)] * len(seg)
    prompt_ids = encode_prompt(tok, prompt_text)
    full, full_mask = prompt_ids + ids + [_eos_id(tok)], [0] * len(prompt_ids) + mask + [1]
    return {"input_ids": full[:max_len], "loss_mask": full_mask[:max_len], "truncated": len(full) > max_len}


def encode_pair(tok, prompt_text: str, chosen: str, rejected: str, max_len: int) -> dict:
    """`{chosen_ids, rejected_ids, chosen_mask, rejected_mask, truncated}` sharing one prompt."""
    prompt_ids = encode_prompt(tok, prompt_text)
    out = {"truncated": False}
    for name, text in (("chosen", chosen), ("rejected", rejected)):
        response_ids = tok(text, add_special_tokens=False)["input_ids"] + [_eos_id(tok)]
        ids, mask, truncated = _join(prompt_ids, response_ids, max_len)
        out[f"{name}_ids"], out[f"{name}_mask"] = ids, mask
        out["truncated"] = out["truncated"] or truncated
    return out


def step_end_tokens(offsets: list[tuple[int, int]], step_ends: list[int]) -> list[int]:
    """For each step's end character (exclusive), the index of the last token that starts before it.

    Works for any tokenizer with an offset mapping: a token that spans the end of a step and the
    separator after it (e.g. ".\\n" in a subword vocabulary) still counts as that step's last token.
    """
    positions = []
    for end in step_ends:
        index = max((i for i, (start, stop) in enumerate(offsets) if start < end and stop > start), default=None)
        if index is None:
            raise ValueError(f"no token ends the step that ends at character {end}")
        positions.append(index)
    return positions


def encode_steps(
    tok, prompt_text: str, steps: list[str], labels: list[int], max_len: int, sep: str = "\n"
) -> dict:
    """`{input_ids, step_positions, step_labels, truncated}` for process-reward training.

    The response is `sep.join(steps)` followed by EOS. `step_positions[j]` is the index in
    `input_ids` of the last token of step j (where the PRM reads its score); steps whose last token
    falls beyond `max_len` are dropped together with their labels.
    """
    if len(steps) != len(labels):
        raise ValueError(f"{len(steps)} steps but {len(labels)} labels")
    if any(not step for step in steps):
        raise ValueError("steps must be non-empty strings")
    step_ends, cursor = [], 0
    for step in steps:
        cursor += len(step)
        step_ends.append(cursor)
        cursor += len(sep)
    encoded = tok(sep.join(steps), add_special_tokens=False, return_offsets_mapping=True)
    prompt_ids = encode_prompt(tok, prompt_text)
    ends = step_end_tokens(encoded["offset_mapping"], step_ends)
    ids, _, truncated = _join(prompt_ids, encoded["input_ids"] + [_eos_id(tok)], max_len)
    kept = [(len(prompt_ids) + end, label) for end, label in zip(ends, labels) if len(prompt_ids) + end < max_len]
    return {
        "input_ids": ids,
        "step_positions": [position for position, _ in kept],
        "step_labels": [int(label) for _, label in kept],
        "truncated": truncated,
    }


def pad_to(seqs: list[list], value, side: str = "right", dtype: torch.dtype = torch.long) -> torch.Tensor:
    """Stack ragged sequences into a [batch, max_len] tensor, filling with `value` on `side`."""
    if side not in ("left", "right"):
        raise ValueError(f"side must be 'left' or 'right', got {side!r}")
    width = max((len(seq) for seq in seqs), default=0)
    rows = [
        list(seq) + [value] * (width - len(seq)) if side == "right" else [value] * (width - len(seq)) + list(seq)
        for seq in seqs
    ]
    return torch.tensor(rows, dtype=dtype).reshape(len(seqs), width)


def collate_padded(batch: list[list[int]], pad_id: int, side: str = "right") -> tuple[torch.Tensor, torch.Tensor]:
    """(input ids [batch, max_len], attention mask [batch, max_len]) with padding on `side`.

    Right padding keeps token indices (loss masks, step positions) unchanged; use left padding for
    generation so every prompt ends at the last column.
    """
    ids = pad_to(batch, pad_id, side)
    attention_mask = pad_to([[1] * len(seq) for seq in batch], 0, side)
    return ids, attention_mask
