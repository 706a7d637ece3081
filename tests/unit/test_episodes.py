"""Multi-turn trajectories through the hf engine (rlft/envs/episodes.py) on a tiny random Llama: the
tokens trained are the tokens sampled, environment tokens carry no loss weight (and receive no
gradient), the limits end trajectories with truncation flags, and a chat template renders each
environment message once."""
from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from helpers import Scripted, require, sandbox_missing
from rlft.algos import AGGREGATIONS, POLICY_LOSSES, AggDenominator, PolicyLossConfig
from rlft.data.tokenizer import build_char_tokenizer
from rlft.envs import Environment, Reply, Score, episodes
from rlft.rollout import batch as rb
from rlft.rollout.generate import Frozen, HFEngine, Sampling
from rlft.stages.update import micro_forward


class Digits(Environment):
    """Every digit the model writes ends its turn; the environment answers ` [k]` (k: its reply count)."""
    name = "digits"
    stop = tuple("0123456789")
    max_turns = 4

    def __init__(self):
        self.replies = []

    def step(self, row, transcript):
        self.replies.append(transcript)
        return Reply(text=f" [{len(self.replies) % 10}]", tool_call=True)

    def score(self, row, completion):
        return Score(reward=float(len(completion) % 2), correct=False)


class Recording:
    """The hf engine, keeping every completion it returns (what the model sampled)."""

    def __init__(self, engine):
        self.engine, self.calls = engine, []

    def generate(self, prompt_ids, n, sampling, seed=None):
        out = self.engine.generate(prompt_ids, n, sampling, seed)
        self.calls.append((prompt_ids, out.completion_ids, out.stopped))
        return out


@pytest.fixture(scope="module")
def setup():
    tok = build_char_tokenizer()
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=len(tok), hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                      num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=256,
                      pad_token_id=tok.pad_token_id, eos_token_id=tok.eos_token_id, bos_token_id=tok.bos_token_id)
    model = LlamaForCausalLM(cfg).eval()
    with torch.no_grad():  # digits likely, so that turns end on the stop strings
        for d in "0123456789":
            model.lm_head.weight[tok.convert_tokens_to_ids(d)] *= 0
        model.lm_head.bias = None
    prompts = [tok(t, add_special_tokens=False)["input_ids"] for t in ["Q: 1+2?\nA:", "Q: seven?\nA:", "Q: 3?\nA:"]]
    return tok, model, prompts


def hf(model, tok):
    return HFEngine(Frozen(model), tok, torch.device("cpu"),
                    SimpleNamespace(batch_size=8, hf_cache="dynamic", hf_bucket=True, hf_pad_multiple=1, hf_compile=False,
                                    hf_share_prefill=False))


def sample(setup, limits=episodes.Limits(max_turns=4, max_env_tokens=64), n=3, max_new=40):
    tok, model, prompts = setup
    engine, env = Recording(hf(model, tok)), Digits()
    torch.manual_seed(1)
    out = episodes.sample(engine, env, [{}] * len(prompts), prompts, n, Sampling(max_new, True, 1.5), 0, tok, limits)
    return out, engine, env


def test_model_turns_and_environment_replies_form_one_sequence_of_the_sampled_tokens(setup):
    tok = setup[0]
    out, engine, env = sample(setup)
    assert len(engine.calls) > 1 and any(t > 1 for t in out.turns)  # multi-turn happened
    # replay the engine's calls: each trajectory is its turns' tokens as sampled plus each reply encoded once
    replayed = {k: list(c) for k, c in enumerate(engine.calls[0][1])}
    masks = {k: [1] * len(c) for k, c in replayed.items()}
    for prompt_ids, completions, _ in engine.calls[1:]:
        for ids, turn in zip(prompt_ids, completions):
            k = next(k for k in replayed if setup[2][out.prompt_index[k]] + replayed[k] == ids[:len(ids) - 4]
                     and len(ids) - len(setup[2][out.prompt_index[k]]) - len(replayed[k]) == 4)
            reply = ids[len(setup[2][out.prompt_index[k]]) + len(replayed[k]):]
            assert tok.decode(reply).startswith(" [")
            replayed[k] += reply + turn
            masks[k] += [0] * len(reply) + [1] * len(turn)
    for k, trajectory in enumerate(out.completion_ids):
        assert trajectory == replayed[k][:len(trajectory)] and len(trajectory) <= 40
        assert out.token_mask[k] == masks[k][:len(trajectory)]
        assert out.tool_calls[k] == out.turns[k] - 1 or out.truncated[k]
        assert len(out.logp[k]) == len(trajectory)
        assert all(lp == 0.0 for lp, w in zip(out.logp[k], out.token_mask[k]) if not w)
    # the trainer's tensors hold exactly these tokens, the response mask exactly the model's
    per_prompt = [setup[2][i] for i in out.prompt_index]
    ids, attn, mask = rb.build_sequences(per_prompt, out.completion_ids, tok.pad_token_id, out.token_mask)
    for k, (p, c, w) in enumerate(zip(per_prompt, out.completion_ids, out.token_mask)):
        assert ids[k, :len(p) + len(c)].tolist() == p + c
        assert mask[k, len(p) - 1:len(p) - 1 + len(c)].tolist() == w and mask[k, :len(p) - 1].sum() == 0


def test_limits_end_trajectories_as_truncated(setup):
    out, _, _ = sample(setup, episodes.Limits(max_turns=2, max_env_tokens=64))
    assert max(out.turns) <= 2
    assert all(out.truncated[k] for k in range(len(out.turns)) if out.turns[k] == 2 and out.stopped[k])
    out, _, _ = sample(setup, episodes.Limits(max_turns=9, max_env_tokens=4))
    assert max(sum(1 - w for w in m) for m in out.token_mask) <= 4  # at most one 4-token reply
    assert any(out.truncated)


def test_environment_tokens_get_no_gradient(setup):
    tok, model, prompts = setup
    out, _, _ = sample(setup)
    per_prompt = [prompts[i] for i in out.prompt_index]
    ids, attn, mask = rb.build_sequences(per_prompt, out.completion_ids, tok.pad_token_id, out.token_mask)
    ro = rb.Rollout(rows=[{}] * len(ids), prompt_texts=[""] * len(ids), completions=out.texts,
                    completion_ids=out.completion_ids, input_ids=ids, attention_mask=attn, mask=mask,
                    truncated=torch.tensor(out.truncated), prompt_lens=[len(p) for p in per_prompt])
    env_targets = (mask == 0) & (attn[:, 1:] == 1)
    env_targets[:, :min(len(p) for p in per_prompt)] = False  # prompt columns are context anyway
    model.train()
    micro_forward(model, ro, slice(0, 1), 1.0)  # the first forward's check of the head, not counted below
    for packed in (False, True):
        model.zero_grad()
        head_tokens = []  # tokens the LM head ran on: the forward's chunks, then their recompute in the backward
        hook = model.lm_head.register_forward_hook(lambda m, i, o: head_tokens.append(i[0].shape[:-1].numel()))
        _, _, cols, m, _, logp = micro_forward(model, ro, slice(0, len(ids)), 1.0, packed)
        adv = torch.ones_like(logp)
        loss_tok, _ = POLICY_LOSSES.get("ppo_clip")(logp, logp.detach(), adv, m, PolicyLossConfig(0.2, 0.2, None))
        denom = AggDenominator(num_seqs=float(len(ids)), num_tokens=float(m.sum()), max_len=40.0)
        AGGREGATIONS.get("token-mean")(loss_tok, m, denom).backward()
        hook.remove()
        env_cols, model_cols = env_targets[:, cols], mask[:, cols] > 0
        assert env_cols.any() and (logp[env_cols] == 0).all() and (logp[model_cols] < 0).all()
        # the head ran only where the target is a model token, so an environment token has no logits to train
        assert sum(head_tokens) == 2 * int(model_cols.sum())
        assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in model.lm_head.parameters())
    model.eval()


CHATML = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
          "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


def test_a_chat_template_renders_each_environment_message_once():
    tok = build_char_tokenizer()
    tok.chat_template = CHATML
    reply = Reply(text="raw", role="tool", content="391")
    between = episodes.chat_reply_text(tok, reply)
    assert between == "<|im_end|>\n<|im_start|>tool\n391<|im_end|>\n<|im_start|>assistant\n"
    # prompt, a model turn, the reply and the next model turn read as the template renders the conversation
    prompt = tok.apply_chat_template([{"role": "user", "content": "17*23?"}], tokenize=False, add_generation_prompt=True)
    whole = prompt + "```python\nprint(17*23)\n```" + between + "391"
    assert whole == tok.apply_chat_template(
        [{"role": "user", "content": "17*23?"}, {"role": "assistant", "content": "```python\nprint(17*23)\n```"},
         {"role": "tool", "content": "391"}, {"role": "assistant", "content": "391"}], tokenize=False)[:len(whole)]
    assert tok.decode(episodes.reply_ids(tok, reply, chat=True)) == between
    assert tok.decode(episodes.reply_ids(tok, reply, chat=False)) == "raw"


def test_a_single_turn_environment_is_one_engine_call(setup):
    tok, model, prompts = setup

    class One(Digits):
        stop = ()

    engine = Recording(hf(model, tok))
    out = episodes.sample(engine, One(), [{}] * 3, prompts, 2, Sampling(16, False), 0, tok,
                          episodes.Limits(4, 64))
    assert len(engine.calls) == 1 and out.token_mask is None and out.turns is None


def test_hostile_tool_code_is_that_steps_error_and_the_trajectory_goes_on():
    require(sandbox_missing())
    from omegaconf import OmegaConf

    from rlft.config.schema import Config
    from rlft.envs.python_tool import PythonEnv

    cfg = OmegaConf.structured(Config)
    cfg.env.name, cfg.env.timeout_s, cfg.env.cpu_s = "python", 15.0, 1  # the CPU limit first, even on a loaded machine
    tok = build_char_tokenizer()
    turns = ["Let me try.\n```python\nwhile True: pass\n```", "\n```python\nopen('/usr/x', 'w')\n```",
             "\n```python\nprint(6*7)\n```", "\n#### 42"]
    out = episodes.sample(Scripted(tok, turns), PythonEnv(cfg), [{"answer": "42"}], [[5, 6]], 1,
                          Sampling(3000, True), 0, tok, episodes.Limits(max_turns=4, max_env_tokens=2000))
    text = out.texts[0]
    assert "[stopped: cpu time limit]" in text and "open('/usr/x', 'w')" in text and "[stopped: exit code 1]" in text
    assert "<output>\n42\n\n</output>" in text and text.endswith("#### 42")
    assert (out.turns[0], out.tool_calls[0], out.tool_errors[0], out.truncated[0]) == (4, 3, 2, False)
    assert PythonEnv(cfg).score({"answer": "42"}, text).correct
    # the model's turns are trained as written, every tool output is context
    model_text = tok.decode([t for t, w in zip(out.completion_ids[0], out.token_mask[0]) if w], skip_special_tokens=True)
    assert model_text == "".join(turns)
