"""A chat model's own tool-call format: how a turn that calls a tool ends, and what it called.

Chat models that call tools write the call in their own markup, and their tokenizers say which:

* a tokenizer with a `response_template` (transformers' declarative response parsing, shipped in the
  tokenizer_config.json of recent models) parses a model turn into a message; its `tool_calls` field
  names the markers around one call;
* a chat template that writes `<tool_call>...</tool_call>` around a JSON `{"name", "arguments"}` object
  (the Hermes format of the Qwen2.5, Qwen3, SmolLM3 and Hermes families) and ships no response
  template is read with HERMES below, the same format written as a response template.

A turn ends at the call's closing marker (a stop string: the markers must be ordinary text, not single
special tokens, which engines strip before they match stop strings). The call's text is what the model
sampled; the tool's reply is rendered by the chat template as a `tool` message, once.
"""
from __future__ import annotations

import json
from dataclasses import dataclass

from rlft.errors import ConfigError

HERMES = {
    "start_anchor_pattern": "^",
    "fields": {
        "content": {"content": "text"},
        "tool_calls": {"open": "<tool_call>", "close": "</tool_call>", "content": "json", "repeats": True,
                       "transform": {"type": "function", "function": "{content}"}},
    },
}
"""The Hermes tool-call format as a transformers response template."""


class ToolFormatError(ConfigError):
    """The tokenizer has no tool-call format rlft can read."""


@dataclass
class ToolCall:
    name: str
    arguments: dict


@dataclass
class ToolCallFormat:
    template: dict
    """A transformers response template with a `tool_calls` field."""
    open: str
    close: str

    @property
    def stop(self) -> tuple[str, ...]:
        return (self.close,)

    def last_call(self, transcript: str) -> tuple[str | None, list[ToolCall] | str | None]:
        """(the call's text, what it called) for a call that ends `transcript` (trailing whitespace
        aside): the calls, or a message saying why they cannot be read. (None, None) when no call ends it."""
        text = transcript.rstrip()
        if not text.endswith(self.close) or self.open not in text:
            return None, None
        call_text = text[text.rindex(self.open):]
        from transformers.utils.chat_parsing import parse_response

        try:
            message = parse_response(call_text, self.template, prefix="")
        except (ValueError, KeyError) as e:
            return call_text, f"the tool call could not be read ({first_line(e)})"
        calls = []
        for item in message.get("tool_calls") or []:
            fn = item.get("function", item) if isinstance(item, dict) else None
            args = fn.get("arguments") if isinstance(fn, dict) else None
            if isinstance(args, str):  # some formats carry the arguments as a JSON string
                try:
                    args = json.loads(args)
                except json.JSONDecodeError:
                    args = None
            if not isinstance(fn, dict) or not isinstance(fn.get("name"), str) or not isinstance(args, dict):
                return call_text, 'a tool call needs a "name" and an "arguments" object'
            calls.append(ToolCall(fn["name"], args))
        if not calls:
            return call_text, "the tool call could not be read"
        return call_text, calls


def first_line(e: Exception) -> str:
    return str(e).strip().split("\n")[0][:200]


def literal(value, what: str) -> str:
    if isinstance(value, list) and value:
        value = value[0]
    if not isinstance(value, str) or not value:
        raise ToolFormatError(f"the tokenizer's response_template gives its tool_calls field no literal {what} "
                              "marker (a pattern cannot be a stop string); use env.tool_format=fenced")
    return value


def tool_call_format(tokenizer) -> ToolCallFormat:
    """The tokenizer's tool-call format (its response template, else Hermes where its chat template writes
    `<tool_call>`); a ToolFormatError naming what is missing otherwise."""
    chat_template = getattr(tokenizer, "chat_template", None)
    if not chat_template:
        raise ToolFormatError("env.tool_format=chat needs a tokenizer with a chat template; this one has none: "
                              "use env.tool_format=fenced")
    if not isinstance(chat_template, str):  # several named templates: the default one
        chat_template = dict(chat_template).get("default", "")
    if "tools" not in chat_template:
        raise ToolFormatError("env.tool_format=chat: the tokenizer's chat template does not render tools; "
                              "use env.tool_format=fenced")
    template = getattr(tokenizer, "response_template", None)
    if template is not None:
        field = (template.get("fields") or {}).get("tool_calls") if isinstance(template, dict) else None
        if not isinstance(field, dict):
            raise ToolFormatError("env.tool_format=chat: the tokenizer's response_template has no tool_calls "
                                  "field; use env.tool_format=fenced")
        fmt = ToolCallFormat(template, literal(field.get("open"), "opening"), literal(field.get("close"), "closing"))
    elif "<tool_call>" in chat_template:
        fmt = ToolCallFormat(HERMES, "<tool_call>", "</tool_call>")
    else:
        raise ToolFormatError("env.tool_format=chat: the tokenizer has no response_template and its chat template "
                              "does not use <tool_call> markers, so rlft cannot read its tool calls; "
                              "use env.tool_format=fenced")
    check_parser(fmt)
    special = set(getattr(tokenizer, "all_special_tokens", []) or [])
    for marker in (fmt.open, fmt.close):
        if marker in special:
            raise ToolFormatError(f"env.tool_format=chat: the tool-call marker {marker!r} is a special token, which "
                                  "the engines strip before matching stop strings; use env.tool_format=fenced")
    return fmt


def check_parser(fmt: ToolCallFormat) -> None:
    """The installed transformers reads response templates (and, for HERMES, finds a call in it)."""
    import importlib.util

    import transformers

    found = importlib.util.find_spec("transformers.utils.chat_parsing") is not None
    if found and fmt.template is HERMES:
        calls = fmt.last_call('<tool_call>{"name": "python", "arguments": {"code": "1"}}</tool_call>')[1]
        found = isinstance(calls, list) and calls[0].arguments == {"code": "1"}
    if not found:
        raise ToolFormatError(f"env.tool_format=chat: transformers {transformers.__version__} does not read "
                              "response templates as 5.19 does; upgrade transformers or use env.tool_format=fenced")


def call_text(tokenizer, fmt: ToolCallFormat, name: str, arguments: dict) -> str:
    """How the chat template writes an assistant turn that calls `name(arguments)`, from the generation
    prompt to the call's closing marker, where a sampled turn stops (for demonstrations; a
    ToolFormatError if the template writes it some other way)."""
    user = [{"role": "user", "content": "q"}]
    prompt = tokenizer.apply_chat_template(user, tokenize=False, add_generation_prompt=True)
    call = {"type": "function", "function": {"name": name, "arguments": arguments}}
    full = tokenizer.apply_chat_template(user + [{"role": "assistant", "content": "", "tool_calls": [call]}],
                                         tokenize=False)
    if not full.startswith(prompt) or fmt.close not in full[len(prompt):]:
        raise ToolFormatError("the chat template does not write an assistant tool call after its generation prompt; "
                              "use env.tool_format=fenced")
    text = full[len(prompt):]
    return text[:text.rindex(fmt.close) + len(fmt.close)].lstrip()
