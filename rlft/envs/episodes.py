"""Multi-turn sampling: model turns and environment replies in one token sequence.

A trajectory is the prompt's tokens followed by model turns and environment turns. Every model turn
is sampled by the rollout engine (hf or vllm) and kept as the engine returned its token ids: it is
never decoded and encoded again, so the tokens trained are exactly the tokens sampled. An
environment reply is rendered once (its text, or with a chat template its message) and encoded
once; its tokens are context for the next turn and carry loss weight 0 (`token_mask`).

Active trajectories advance together: one engine call per turn for all of them. A model turn ends on
EOS or on one of the environment's stop strings; the environment then replies with text (a new
model turn follows it), with nothing (the stop string opened no tool call: the same turn goes on) or
with the end. A trajectory ends on EOS, when the environment says so, or at a limit, which marks it
truncated (the truncation policy reads the flag): `rollout.max_new_tokens` tokens after the prompt
(model and environment tokens together), `env.max_turns` model turns, `env.max_env_tokens`
environment tokens, MAX_CALLS_PER_TURN x env.max_turns engine calls.
"""
from __future__ import annotations

from dataclasses import dataclass, replace

from rlft.envs.base import Environment, Reply
from rlft.rollout.sampling import Generations, Sampling

MAX_CALLS_PER_TURN = 4  # engine calls per allowed turn: a stop string that opens no tool call costs one


@dataclass
class Limits:
    max_turns: int
    max_env_tokens: int
    chat: bool = False  # render replies that have a role as chat messages (the tokenizer's template)


def chat_reply_text(tokenizer, reply: Reply) -> str:
    """The text a chat template puts between the end of an assistant turn's content and the start of
    the next assistant turn's content, with `reply` as a message in between: the closing of the
    model's turn, the reply's message and the generation prompt (rendered once, by the template)."""
    marker = "\x00rlft-turn\x00"
    head = [{"role": "user", "content": "q"}, {"role": "assistant", "content": marker}]
    content = reply.text if reply.content is None else reply.content
    text = tokenizer.apply_chat_template(head + [{"role": reply.role, "content": content}], tokenize=False,
                                         add_generation_prompt=True)
    return text[text.rindex(marker) + len(marker):]


def reply_ids(tokenizer, reply: Reply, chat: bool) -> list[int]:
    """The reply's tokens, encoded once: its message through the chat template, or its text."""
    if reply.role and chat:
        text = chat_reply_text(tokenizer, reply)
    else:
        text = reply.text
    return tokenizer(text, add_special_tokens=False)["input_ids"] if text else []


def single_turn(env: Environment) -> bool:
    return not env.stop or env.max_turns <= 1


def sample(engine, env: Environment, rows: list[dict], prompt_ids: list[list[int]], n: int, sampling: Sampling,
           seed: int, tokenizer, limits: Limits) -> Generations:
    """n trajectories per prompt (rows i*n .. i*n+n-1 answer prompt i, as engine.generate lays them out).
    A single-turn environment is one engine call, exactly as without an environment."""
    if single_turn(env):
        return engine.generate(prompt_ids, n, sampling, seed)
    turn_sampling = replace(sampling, stop=tuple(env.stop))
    out = engine.generate(prompt_ids, n, turn_sampling, seed)
    count = len(out.completion_ids)
    out.completion_ids = [list(c) for c in out.completion_ids]
    out.logp = [list(lp) for lp in out.logp]
    out.token_mask = [[1] * len(c) for c in out.completion_ids]
    out.turns, out.tool_calls, out.tool_errors = [1] * count, [0] * count, [0] * count
    env_tokens = [0] * count
    active = [k for k in range(count) if out.stopped[k]]
    for call in range(1, MAX_CALLS_PER_TURN * limits.max_turns):
        going = []
        replies = env.steps([rows[out.prompt_index[k]] for k in active],
                            [tokenizer.decode(out.completion_ids[k], skip_special_tokens=True) for k in active])
        for k, reply in zip(active, replies):
            if reply.done:
                continue
            ids = reply_ids(tokenizer, reply, limits.chat)
            if ids and out.turns[k] >= limits.max_turns:  # the model may take no further turn
                out.truncated[k] = True
                continue
            out.tool_calls[k] += int(reply.tool_call)
            out.tool_errors[k] += int(reply.error is not None)
            if env_tokens[k] + len(ids) > limits.max_env_tokens or \
                    len(out.completion_ids[k]) + len(ids) >= sampling.max_new_tokens:
                out.truncated[k] = True
                continue
            env_tokens[k] += len(ids)
            out.completion_ids[k] += ids
            out.logp[k] += [0.0] * len(ids)
            out.token_mask[k] += [0] * len(ids)
            out.turns[k] += int(bool(ids))  # a reply with text starts a new model turn
            going.append(k)
        if not going:
            break
        room = [sampling.max_new_tokens - len(out.completion_ids[k]) for k in going]
        cont = engine.generate([prompt_ids[out.prompt_index[k]] + out.completion_ids[k] for k in going], 1,
                               replace(turn_sampling, max_new_tokens=max(room)), seed + 7919 * call)
        active = []
        for j, k in enumerate(going):
            tokens, logp = cont.completion_ids[j][:room[j]], cont.logp[j][:room[j]]
            cut = len(cont.completion_ids[j]) > room[j]
            out.completion_ids[k] += tokens
            out.logp[k] += logp
            out.token_mask[k] += [1] * len(tokens)
            out.truncated[k] = cont.truncated[j] or cut
            out.stopped[k] = cont.stopped[j] and not cut
            if out.stopped[k]:
                active.append(k)
    for k in active:  # still waiting on the environment after the last engine call allowed
        out.truncated[k] = True
    out.texts = [tokenizer.decode(c, skip_special_tokens=True) for c in out.completion_ids]
    return out


def limits(cfg, env: Environment, tokenizer=None) -> Limits:
    chat = tokenizer is not None and bool(getattr(tokenizer, "chat_template", None)) \
        and cfg.data.use_chat_template is not False
    return Limits(max_turns=env.max_turns, max_env_tokens=int(cfg.env.max_env_tokens), chat=chat)
