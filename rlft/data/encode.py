"""Tokenising rendered prompts and responses into training examples.

Examples are plain lists of ints; only the collate helpers build tensors. Every response ends with
the tokenizer's EOS token, which is part of the loss (the model must learn to stop). Prompt and
response are tokenised separately and concatenated, so the prompt/response boundary is exact for
any tokenizer. A BOS token is prepended only when the tokenizer itself adds one by default (Llama
style); the built-in character tokenizer adds none. Sequences longer than `max_len` are cut from
the right, which drops the EOS; such examples carry `truncated=True`.

Text from the data that spells one of the tokenizer's special tokens (data.special_tokens_in_text=literal,
the default) is encoded as the characters it is: a response wholly, a prompt where the user's own text lies
in it (a `PromptText` from `literal_prompt`), while the chat template's own control tokens stay tokens.
"""

import torch


class PromptText(str):
    """A rendered prompt, remembering how to treat special-token strings in it: `literal` (the data's text is
    text) and `spans`, the (start, end) character ranges of the user's text that spell a special token."""
    literal: bool = False
    spans: tuple[tuple[int, int], ...] = ()


_SEEN: set[str] = set()


def special_strings(tok) -> list[str]:
    """The tokenizer's special tokens as they are spelled, longest first."""
    return sorted({s for s in getattr(tok, "all_special_tokens", []) if s}, key=len, reverse=True)


def spelled(tok, text: str) -> list[str]:
    """The special tokens whose strings appear in `text`."""
    return [s for s in special_strings(tok) if s in text]


def literal_prompt(tok, text: str, user_texts: list[str]) -> PromptText:
    """`text` (a rendered prompt) as a PromptText that keeps the special-token strings of `user_texts` as text:
    each user text is found where the template put it, in order. Says once per special token that data spells it."""
    out = PromptText(text)
    out.literal = True
    spans, cursor = [], 0
    for user in user_texts:
        found = spelled(tok, user)
        if not found:
            continue
        for candidate in (user, user.strip()):
            start = text.find(candidate, cursor)
            if start >= 0:
                spans.append((start, start + len(candidate)))
                cursor = start + len(candidate)
                break
        warn_spelled(found)
    out.spans = tuple(spans)
    return out


def warn_spelled(found: list[str]) -> None:
    new = [s for s in found if s not in _SEEN]
    if new:
        _SEEN.update(new)
        print(f"[rlft] data text spells the special token(s) {', '.join(map(repr, new))}: encoded as text "
              "(data.special_tokens_in_text=literal; parse makes them act as the tokens)", flush=True)


def encode_text(tok, text: str, literal: bool) -> list[int]:
    """The data's own text (a response, a step): with `literal`, a special-token string in it is text."""
    found = spelled(tok, text) if literal else []
    if found:
        warn_spelled(found)
        return tok(text, add_special_tokens=False, split_special_tokens=True)["input_ids"]
    return tok(text, add_special_tokens=False)["input_ids"]


def _encode_rendered(tok, text: str, spans: tuple[tuple[int, int], ...]) -> list[int]:
    """A rendered prompt whose `spans` hold special-token strings that are text: the text between them is
    encoded as usual (the template's tokens parse), each such string on its own as characters."""
    cuts, specials = [], special_strings(tok)
    for start, end in spans:
        i = start
        while i < end:
            hit = next((s for s in specials if text.startswith(s, i) and i + len(s) <= end), None)
            if hit:
                cuts.append((i, i + len(hit)))
                i += len(hit)
            else:
                i += 1
    ids, pos = [], 0
    for start, end in cuts:
        if start > pos:
            ids += tok(text[pos:start], add_special_tokens=False)["input_ids"]
        ids += tok(text[start:end], add_special_tokens=False, split_special_tokens=True)["input_ids"]
        pos = end
    if pos < len(text):
        ids += tok(text[pos:], add_special_tokens=False)["input_ids"]
    return ids


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
    spans = getattr(prompt_text, "spans", ())
    if spans:
        ids = _encode_rendered(tok, str(prompt_text), spans)
    else:
        ids = tok(prompt_text, add_special_tokens=False)["input_ids"]
    if _adds_bos(tok) and (not ids or ids[0] != tok.bos_token_id):
        ids = [tok.bos_token_id] + ids
    return ids


def _literal(prompt_text: str) -> bool:
    """Whether the data's text that goes with this prompt keeps special-token strings as text."""
    return bool(getattr(prompt_text, "literal", False))


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
    response_ids = encode_text(tok, response_text, _literal(prompt_text)) + [_eos_id(tok)]
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
        response_ids = encode_text(tok, text, _literal(prompt_text)) + [_eos_id(tok)]
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
    response = sep.join(steps)
    found = spelled(tok, response) if _literal(prompt_text) else []
    if found:
        warn_spelled(found)
    encoded = tok(response, add_special_tokens=False, return_offsets_mapping=True,
                  **({"split_special_tokens": True} if found else {}))
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
