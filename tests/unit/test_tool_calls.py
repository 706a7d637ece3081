"""env.tool_format=chat: the python tool called in the chat template's own tool-call format
(rlft/envs/tool_calls.py): the tokenizer's response template where it has one, the Hermes `<tool_call>`
JSON where its chat template writes that; prompts carry the tool's schema, a turn ends at the call's
closing marker, the call's code runs, and demonstrations write calls as the template does."""
from __future__ import annotations

import json

import pytest
from omegaconf import OmegaConf

from helpers import HERMES_TEMPLATE, Scripted, require, sandbox_missing
from rlft.config.schema import Config
from rlft.data.tokenizer import build_char_tokenizer
from rlft.envs import Reply, build, episodes, tool_calls
from rlft.envs.python_tool import PYTHON_TOOL
from rlft.errors import ConfigError
from rlft.rollout.sampling import Sampling
from rlft.stages import inputs

# Another model's markers, declared by its tokenizer's response template: [CALL]{...}[/CALL].
CALL_TEMPLATE = HERMES_TEMPLATE.replace("<tool_call>\n", "[CALL]").replace("\n</tool_call>", "[/CALL]")
CALL_RESPONSE_TEMPLATE = {
    "start_anchor": "<|im_start|>assistant\n",
    "fields": {"content": {"content": "text"},
               "tool_calls": {"open": "[CALL]", "close": "[/CALL]", "content": "json", "repeats": True,
                              "transform": {"type": "function", "function": "{content}"}}},
}


def tokenizer(chat_template=HERMES_TEMPLATE, response_template=None):
    tok = build_char_tokenizer()
    tok.chat_template = chat_template
    if response_template is not None:
        tok.response_template = response_template
    return tok


def config(**env):
    cfg = OmegaConf.structured(Config)
    cfg.env.name, cfg.env.tool_format, cfg.env.timeout_s, cfg.env.instruction = "python", "chat", 15.0, "auto"
    for k, v in env.items():
        cfg.env[k] = v
    return cfg


def call(code: str, name: str = "python", open_="<tool_call>\n", close="\n</tool_call>") -> str:
    return f"{open_}{json.dumps({'name': name, 'arguments': {'code': code}})}{close}"


def test_the_format_comes_from_the_response_template_else_the_chat_templates_tool_call_markers():
    hermes = tool_calls.tool_call_format(tokenizer())
    assert (hermes.open, hermes.stop) == ("<tool_call>", ("</tool_call>",))
    own = tool_calls.tool_call_format(tokenizer(CALL_TEMPLATE, CALL_RESPONSE_TEMPLATE))
    assert (own.open, own.stop) == ("[CALL]", ("[/CALL]",))
    text, calls = own.last_call("Let me compute.\n" + call("print(6*7)", open_="[CALL]", close="[/CALL]") + "\n")
    assert text.startswith("[CALL]") and [(c.name, c.arguments) for c in calls] == [("python", {"code": "print(6*7)"})]
    # a closing marker that ends no call, and a call that is not the transcript's end, are not calls
    assert hermes.last_call("no call here </tool_call>") == (None, None)
    assert hermes.last_call(call("print(1)") + " and more") == (None, None)
    assert "could not be read" in hermes.last_call("<tool_call>{not json</tool_call>")[1]


@pytest.mark.parametrize("tok, why", [
    (tokenizer(None), "needs a tokenizer with a chat template"),
    (tokenizer("{% for m in messages %}{{ m['content'] }}{% endfor %}"), "does not render tools"),
    (tokenizer(HERMES_TEMPLATE.replace("tool_call", "fn")), "does not use <tool_call> markers"),
    (tokenizer(response_template={"start_anchor": "x", "fields": {"content": {}}}), "has no tool_calls field"),
])
def test_a_tokenizer_without_a_readable_tool_call_format_is_a_one_line_error(tok, why):
    with pytest.raises(ConfigError, match=why) as e:
        build(config(), tok)
    assert "use env.tool_format=fenced" in str(e.value) and "\n" not in str(e.value)


def test_a_tool_call_marker_that_is_a_special_token_is_refused():
    tok = tokenizer()
    tok.add_special_tokens({"additional_special_tokens": ["</tool_call>"]})
    with pytest.raises(ConfigError, match="is a special token"):
        build(config(), tok)


def test_prompts_carry_the_tools_schema_through_the_chat_template():
    cfg, tok = config(), tokenizer()
    row = build(cfg, tok).rows("train")[0]
    assert row["tools"] == [PYTHON_TOOL]
    text = inputs.render(cfg, tok, row)
    assert text.startswith("<|im_start|>system\n<tools>\n" + json.dumps(PYTHON_TOOL))
    assert text.endswith("\nYou may run Python with the python tool. End with '#### <answer>'.<|im_end|>\n"
                         "<|im_start|>assistant\n")
    # the fenced format's rows have no tools, and its default instruction explains the fence
    fenced = build(config(tool_format="fenced"), tok).rows("train")[0]
    assert "tools" not in fenced and "```python" in fenced["prompt"]


def test_a_chat_tool_call_runs_its_code_and_the_tokens_trained_are_the_tokens_sampled():
    require(sandbox_missing())
    tok = tokenizer()
    env = build(config(), tok)
    assert env.stop == ("</tool_call>",)
    turns = [call("print(6*7)"), call("print(1)", name="shell"), "<tool_call>{oops</tool_call>", "#### 42"]
    out = episodes.sample(Scripted(tok, turns), env, [{"answer": "42"}], [[5, 6]], 1, Sampling(3000, True), 0, tok,
                          episodes.limits(config(max_env_tokens=2000), env, tok))
    text = out.texts[0]
    # each result is a tool message rendered by the template, once
    reply = episodes.chat_reply_text(tok, Reply(role="tool", content="42\n"))
    assert reply.startswith("<|im_end|>\n<|im_start|>user\n<tool_response>\n42\n") and "</tool_call>" + reply in text
    assert "[error: unknown tool call shell(code): the only tool is python(code)]" in text
    assert "[error: the tool call could not be read" in text
    assert (out.turns[0], out.tool_calls[0], out.tool_errors[0], out.truncated[0]) == (4, 3, 2, False)
    assert env.score({"answer": "42"}, text).correct
    model_text = tok.decode([t for t, w in zip(out.completion_ids[0], out.token_mask[0]) if w], skip_special_tokens=True)
    assert model_text == "".join(turns)


def test_demonstrations_write_each_calculation_as_the_templates_tool_call_with_the_output_untrained():
    cfg, tok = config(), tokenizer()
    env = build(cfg, tok)
    row = next(r for r in env.rows("train") if "<<" in r["response"] or "=" in r["response"])
    segments = env.demonstration(row)
    trained = [t for t, w in segments if w]
    context = [t for t, w in segments if not w]
    assert trained[0].startswith("<tool_call>\n{\"name\": \"python\", \"arguments\": {\"code\": \"print(")
    assert trained[-1].startswith("#### ") and all(c.startswith("<|im_end|>\n<|im_start|>user\n<tool_response>")
                                                   for c in context)
    # the parser reads each demonstrated call back as the code it runs
    fmt = tool_calls.tool_call_format(tok)
    for t in trained[:-1]:
        code = fmt.last_call(t)[1][0].arguments["code"]
        assert code.startswith("print(") and env.run(code).content.strip() == context[trained.index(t)].split(
            "<tool_response>\n")[1].split("\n</tool_response>")[0].strip()
    # SFT trains the calls and the answer, not the template's tool messages
    cfg.train.max_seq_len, cfg.data.max_train_rows = 2048, 4
    example = inputs.sft_examples(cfg, tok)[0]
    first = build(cfg, tok).demonstration(build(cfg, tok).rows("train")[0])
    trained_ids = [t for t, m in zip(example["input_ids"], example["loss_mask"]) if m]
    assert tok.decode(trained_ids, skip_special_tokens=True) == "".join(t for t, w in first if w)
