"""Turning a prompt (a question string or a list of chat messages) into the text the model sees.

Chat models get their own chat template with the generation prompt appended. Models without one
(the built-in character-level model, base models) get a short plain template; short matters because
every prompt character is a token for the character-level model.
"""

from .loading import DataError

DEFAULT_TEMPLATE = "Q: {question}\nA:\n"
"""Plain prompt template; `{question}` is replaced by the prompt text."""


def _has_chat_template(tokenizer) -> bool:
    return bool(getattr(tokenizer, "chat_template", None))


def render_prompt(
    tokenizer,
    prompt: str | list[dict],
    template: str = DEFAULT_TEMPLATE,
    use_chat_template: bool | None = None,
    tools: list[dict] | None = None,
) -> str:
    """The prompt text to tokenize.

    The chat template is used when `prompt` is a list of messages, or when the tokenizer has one
    and `use_chat_template` is not False (a plain string becomes a single user message). Otherwise
    `template` is filled with the string. A single-message chat prompt falls back to `template`
    when the tokenizer has no chat template; longer conversations need one. `tools` (JSON schemas of the
    functions the model may call) go to the chat template, which describes them in its own words; a
    prompt with tools needs a chat template.
    """
    is_chat = isinstance(prompt, list)
    has_template = _has_chat_template(tokenizer)
    if use_chat_template and not has_template:
        raise DataError("use_chat_template=true but the tokenizer has no chat template")
    if tools and not (has_template and use_chat_template is not False):
        raise DataError("a prompt with tools needs the tokenizer's chat template (and data.use_chat_template not false)")
    if is_chat and not has_template:
        if len(prompt) == 1 and prompt[0].get("role") == "user":
            return template.format(question=prompt[0]["content"])
        raise DataError("a multi-message chat prompt needs a tokenizer with a chat template")
    if is_chat or (has_template and use_chat_template is not False):
        messages = prompt if is_chat else [{"role": "user", "content": prompt}]
        return tokenizer.apply_chat_template(messages, tools=tools or None, tokenize=False, add_generation_prompt=True)
    return template.format(question=prompt)
