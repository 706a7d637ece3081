"""`env=python`: the model may run Python (multi-turn tool use, for real models).

The model writes a fenced block

    ```python
    print(17 * 23)
    ```

and its turn ends at the closing fence (the stop string "```"; an opening fence ends nothing). The
environment runs the block in a sandbox (rlft/envs/sandbox.py, `env.sandbox`: bubblewrap's namespaces by
default, refused in one line where they cannot be had; CPU-time, wall-time, memory, process and disk
limits) and replies with its output, cut to
`env.max_output_chars`, as a tool message (with a chat template: a `tool` turn rendered by the
template once; without one: `<output>...</output>` text). A run that fails or breaks a limit replies
with what it printed and why it stopped; the trajectory goes on. At most `env.max_turns` model turns.

With `env.tool_format=chat` the model calls a `python` tool in its chat template's own tool-call format
(rlft/envs/tool_calls.py: the tokenizer's response template, or the Hermes `<tool_call>` JSON): the
prompt is rendered with the tool's schema (PYTHON_TOOL), the turn ends at the call's closing marker, and
the call's `code` argument runs in the same sandbox.

Rows and the final-answer check (`#### <answer>`) are env=math's; `env.instruction` is added to each
question (the conf/env/python.yaml default explains the tool and the answer format).
"""
from __future__ import annotations

import os
import re
from concurrent.futures import ThreadPoolExecutor

from rlft.envs import sandbox, tool_calls
from rlft.envs.base import Reply
from rlft.envs.calculator import CALL, calculate, with_calls
from rlft.envs.episodes import chat_reply_text
from rlft.envs.math import MathEnv
from rlft.errors import ConfigError

TOOL_FORMATS = ("fenced", "chat")
PYTHON_TOOL = {
    "type": "function",
    "function": {
        "name": "python",
        "description": "Run Python code in a sandbox and return what it prints.",
        "parameters": {
            "type": "object",
            "properties": {"code": {"type": "string", "description": "The code to run; print what you need to see."}},
            "required": ["code"],
        },
    },
}
"""The tool's schema, as the chat template receives it with env.tool_format=chat."""
INSTRUCTIONS = {
    "fenced": "You may run Python: write a ```python block and its output is returned. End with '#### <answer>'.",
    "chat": "You may run Python with the python tool. End with '#### <answer>'.",
}
"""env.instruction=auto: how to use the tool in each env.tool_format, and how to answer."""
BLOCK = re.compile(r"```(?:python|py)?[ \t]*\n(.*?)```", re.DOTALL)


def last_block(transcript: str) -> str | None:
    """The code of a fenced block that ends the transcript (trailing whitespace aside), else None."""
    text = transcript.rstrip()
    blocks = list(BLOCK.finditer(text))
    if not blocks or blocks[-1].end() != len(text):
        return None
    return blocks[-1].group(1)


def tool_text(result: sandbox.Result, max_chars: int) -> str:
    out = result.output
    if len(out) > max_chars:
        out = out[:max_chars] + f"\n[output cut at {max_chars} characters]"
    if result.error:
        out += ("\n" if out and not out.endswith("\n") else "") + f"[stopped: {result.error}]"
    return out or "[no output]"


class PythonEnv(MathEnv):
    """env=math's rows and answer check, with a sandboxed Python tool."""

    name = "python"
    options_read = MathEnv.options_read + ("instruction", "tool_format", "sandbox", "timeout_s", "cpu_s", "memory_mb",
                                           "max_procs", "disk_mb", "max_output_chars")
    stop = ("```",)
    max_turns = 4

    def __init__(self, cfg):
        super().__init__(cfg)
        env_cfg = cfg.env
        self.sandbox = sandbox.check_mode(str(env_cfg.sandbox))
        self.limits = sandbox.Limits(timeout_s=float(env_cfg.timeout_s), cpu_s=int(env_cfg.cpu_s),
                                     memory_mb=int(env_cfg.memory_mb), max_procs=int(env_cfg.max_procs),
                                     disk_mb=int(env_cfg.disk_mb))
        self.max_output_chars = int(env_cfg.max_output_chars)
        self.tool_format = str(env_cfg.tool_format)
        if self.tool_format not in TOOL_FORMATS:
            raise ConfigError(f"env.tool_format={self.tool_format}: expected one of {', '.join(TOOL_FORMATS)}")
        instruction = str(env_cfg.instruction or "")
        self.instruction = INSTRUCTIONS[self.tool_format] if instruction == "auto" else instruction
        self.calls = None  # the tokenizer's tool-call format (env.tool_format=chat), set by use_tokenizer
        if self.tool_format == "chat":
            self.stop = ()  # the call's closing marker, once the tokenizer is known

    def use_tokenizer(self, tokenizer) -> None:
        super().use_tokenizer(tokenizer)
        if self.tool_format == "chat":
            self.calls = tool_calls.tool_call_format(tokenizer)
            self.stop = self.calls.stop

    def describe(self) -> str:
        """The isolation the code runs under (a SandboxUnavailable line where it cannot be had)."""
        return sandbox.describe(self.sandbox)

    def rows(self, split: str) -> list[dict]:
        rows = super().rows(split)
        chat = self.tool_format == "chat"
        if not self.instruction and not chat:
            return rows
        key = f"{split}+instruction"
        if key not in self._rows:
            extra = {"tools": [PYTHON_TOOL]} if chat else {}
            self._rows[key] = [{**r, **extra, "prompt": with_instruction(r["prompt"], self.instruction)}
                               for r in rows]
        return self._rows[key]

    def steps(self, rows: list[dict], transcripts: list[str]) -> list[Reply]:
        """The trajectories' code runs side by side (each its own sandboxed process)."""
        if len(rows) < 2:
            return super().steps(rows, transcripts)
        with ThreadPoolExecutor(max_workers=min(len(rows), os.cpu_count() or 2)) as pool:
            return list(pool.map(self.step, rows, transcripts))

    def demonstration(self, row: dict) -> list[tuple[str, bool]]:
        """The worked solution with each calculation run as a python block (`print(expr)`), its output
        supplied by the tool (not trained), then the final answer line. Rows with no calculation keep
        their response as it is."""
        text = str(row["response"])
        calls = list(CALL.finditer(text if "<<" in text else with_calls(text)))
        if not calls:
            return super().demonstration(row)
        segments = []
        for m in calls:
            result = printed(m.group(1))
            code = f"print({m.group(1)})"
            if self.calls is not None:  # the call as the chat template writes it, the output as a tool message
                segments.append((tool_calls.call_text(self.tokenizer, self.calls, "python", {"code": code}), True))
                segments.append((chat_reply_text(self.tokenizer, Reply(role="tool", content=f"{result}\n")), False))
                continue
            segments.append((f"```python\n{code}\n```", True))
            segments.append((f"\n<output>\n{result}\n\n</output>\n", False))
        final = [line for line in text.split("\n") if line.strip().startswith("####")]
        answer = with_calls(final[-1]) if final else f"#### {row.get('answer', '')}"
        last = calculate(calls[-1].group(1))[0]
        segments.append((answer if "<<" in text else f"#### {last}", True))
        return segments

    def step(self, row: dict, transcript: str) -> Reply:
        if self.calls is not None:
            return self.chat_step(transcript)
        code = last_block(transcript)
        if code is None:  # an opening fence, or a fence that closes no block: the turn goes on
            return Reply()
        return self.run(code)

    def run(self, code: str) -> Reply:
        result = sandbox.run(code, self.limits, self.sandbox)
        return tool_reply(tool_text(result, self.max_output_chars), result.error)

    def chat_step(self, transcript: str) -> Reply:
        """A call in the tokenizer's tool-call format: its `code` runs; a call that cannot be read, or of
        another tool, is answered with what is wrong (the trajectory goes on)."""
        text, calls = self.calls.last_call(transcript)
        if text is None:  # the closing marker ended no call: the turn goes on
            return Reply()
        if isinstance(calls, str):
            return refusal(calls)
        call = calls[-1]
        if call.name != "python" or not isinstance(call.arguments.get("code"), str):
            return refusal(f"unknown tool call {call.name}({', '.join(call.arguments)}): the only tool is "
                           "python(code)")
        return self.run(call.arguments["code"])


def tool_reply(content: str, error: str | None) -> Reply:
    """The tool's answer to a call: a `tool` message (chat template), else `<output>` text."""
    return Reply(text=f"\n<output>\n{content}\n</output>\n", role="tool", content=content, error=error, tool_call=True)


def refusal(why: str) -> Reply:
    return tool_reply(f"[error: {why}]", why)


def printed(expr: str) -> str:
    """What Python's print shows for an arithmetic expression: a float once `/` or a decimal is in it."""
    from rlft.envs.calculator import evaluate

    try:
        value = evaluate(expr)
    except ValueError:
        return calculate(expr)[0]
    return repr(float(value)) if "/" in expr or "." in expr else str(int(value))


def with_instruction(prompt, instruction: str):
    """The prompt with the instruction after its (last user) text."""
    if not instruction:
        return prompt
    if isinstance(prompt, list):
        messages = [dict(m) for m in prompt]
        for m in reversed(messages):
            if m.get("role") == "user":
                m["content"] = f"{m['content']}\n{instruction}"
                break
        return messages
    return f"{prompt}\n{instruction}"
