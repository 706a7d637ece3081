"""Every built-in environment through the CLI on the tiny model: SFT on its demonstrations, GRPO
through it, `rlft eval` of the result (multi-turn ones report their tool use), and a user environment
by import path (tests/data/toy_env.py) whose trajectories really are multi-turn."""
from __future__ import annotations

import json
import os
import sys

import pytest

from helpers import (HERMES_TEMPLATE, RL_SMALL, TINY, USER_REWARD, assert_finite, changed_tensors, explain,
                     load_safetensors, read_manifest, read_metrics, require, rl_cli, rl_env, run_cli, sandbox_missing,
                     stage_dir)

RUN = "env"
SFT = ["algo=sft", "train.max_steps=3", "train.batch_size=8", "train.micro_batch_per_device=8", "train.save_every=0"]
ENVS = {
    "calculator": ["env=calculator"],
    "python": ["env=python", "env.instruction=", "env.max_turns=2", "env.timeout_s=2"],
    "reasoning_gym": ["env=reasoning_gym", "env.task=chain_sum", "env.train_size=40", "env.test_size=8"],
}


def ok(proc):
    assert proc.returncode == 0, explain(proc)
    return proc


@pytest.mark.parametrize("name", sorted(ENVS))
def test_sft_grpo_and_eval_through_each_environment(tmp_path, name):
    if name == "python":
        require(sandbox_missing())
    env = ENVS[name]
    ok(rl_cli(tmp_path, "train", *SFT, f"run.name={RUN}", *env))
    grpo = ok(rl_cli(tmp_path, "train", "algo=grpo", f"run.name={RUN}", *RL_SMALL, "train.max_steps=1", *env,
                     f"reward.functions=[correctness,{USER_REWARD}:alternate]"))
    assert ("[rlft] sandbox: bubblewrap" in grpo.stdout) == (name == "python")  # the header says what isolates the code
    out = stage_dir(tmp_path, RUN, "grpo")
    assert read_manifest(out)["completed"] is True
    assert changed_tensors(load_safetensors(stage_dir(tmp_path, RUN, "sft") / "final"), load_safetensors(out / "final"))
    rec = [r for r in read_metrics(out) if "reward" in r][-1]
    assert_finite([rec["reward"], rec["reward/correctness"], rec["entropy"]])
    if name != "reasoning_gym":  # the tool environments count turns and calls
        assert rec["turns"] >= 1 and 0 <= rec["tool_use_frac"] <= 1
    evaluation = ok(rl_cli(tmp_path, "eval", f"run.name={RUN}", "model.path=stage:grpo", "eval.num_problems=4",
                           "eval.samples=2", "eval.k=[1,2]", "eval.max_new_tokens=24", *env))
    assert ("[rlft] sandbox: bubblewrap" in evaluation.stdout) == (name == "python")
    record = json.loads((tmp_path / "runs" / RUN / "eval" / "grpo" / "eval.json").read_text())
    assert record["env"] == name and record["metrics"]["num_problems"] == 4
    assert ("tool_use_rate" in record["metrics"]) == (name != "reasoning_gym")


def test_env_python_without_its_sandbox_stops_in_one_line_unless_trusted_is_asked_for(tmp_path):
    """bubblewrap off the PATH: GRPO through env=python refuses before any rank starts; env.sandbox=trusted runs,
    and its header says that nothing isolates the code."""
    env = rl_env(PATH=os.path.dirname(sys.executable))  # this Python, and no bwrap
    args = ["train", "algo=grpo", "model.path=builtin:tiny", f"run.name={RUN}", *RL_SMALL, "train.max_steps=1",
            "env=python", "env.instruction=", "env.max_turns=2", "env.timeout_s=2", *TINY]
    refused = run_cli(tmp_path, *args, env=env)
    assert refused.returncode == 2 and "Traceback" not in refused.stderr, explain(refused)
    line = refused.stderr.strip().splitlines()[-1]
    assert line.startswith("rlft: error: env.sandbox=bwrap: bubblewrap (bwrap) is not on PATH; install bubblewrap")
    assert "env.sandbox=trusted" in line and "[rlft] grpo ->" not in refused.stdout  # no rank started
    assert not stage_dir(tmp_path, RUN, "grpo").exists()
    trusted = ok(run_cli(tmp_path, *args, "env.sandbox=trusted", env=env))
    assert "[rlft] sandbox: NONE (env.sandbox=trusted): the model's code runs as uid" in trusted.stdout
    assert read_manifest(stage_dir(tmp_path, RUN, "grpo"))["completed"] is True


def tiny_chat_model(root):
    """A tiny Qwen2 whose tokenizer has a chat template that renders tools and `<tool_call>` calls."""
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from rlft.data.tokenizer import build_char_tokenizer

    tok = build_char_tokenizer(model_max_length=2048)
    tok.chat_template = HERMES_TEMPLATE
    torch.manual_seed(0)
    config = Qwen2Config(vocab_size=len(tok), hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                         num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=2048,
                         pad_token_id=tok.pad_token_id, eos_token_id=tok.eos_token_id, bos_token_id=tok.bos_token_id)
    Qwen2ForCausalLM(config).save_pretrained(root)
    tok.save_pretrained(root)
    return root


def test_python_tool_calls_in_the_chat_templates_own_format_through_sft_grpo_and_eval(tmp_path):
    env = ["env=python", "env.tool_format=chat", "env.max_turns=2", "env.timeout_s=2", "train.max_seq_len=1024",
           "data.max_train_rows=32"]
    model = tiny_chat_model(tmp_path / "chat-model")

    def rlft(*args):  # the tiny settings, then this test's (its prompts hold the tool's schema)
        return ok(run_cli(tmp_path, *args, *TINY, *env, timeout=300, env=rl_env()))

    rlft("train", *SFT, f"run.name={RUN}", f"model.path={model}")
    rlft("train", "algo=grpo", f"run.name={RUN}", *RL_SMALL, "train.max_steps=1",
         f"reward.functions=[correctness,{USER_REWARD}:alternate]")
    out = stage_dir(tmp_path, RUN, "grpo")
    assert changed_tensors(load_safetensors(stage_dir(tmp_path, RUN, "sft") / "final"), load_safetensors(out / "final"))
    rec = [r for r in read_metrics(out) if "reward" in r][-1]
    assert_finite([rec["reward"], rec["entropy"]]) and rec["turns"] >= 1
    rlft("eval", f"run.name={RUN}", "model.path=stage:grpo", "eval.num_problems=2", "eval.samples=2", "eval.k=[1,2]",
         "eval.max_new_tokens=16", "eval.policy_samples=2")
    # a tokenizer without a tool-call format is one line before anything runs
    for stage in (SFT, ["algo=grpo", "model.path=builtin:tiny", *RL_SMALL]):
        proc = rl_cli(tmp_path, "train", *stage, "run.name=plain", "env=python", "env.tool_format=chat")
        assert proc.returncode != 0 and "env.tool_format=chat needs a tokenizer with a chat template" in proc.stderr
        assert proc.stderr.count("\n") == 1 and " -> " not in proc.stdout  # before the stage starts


def test_a_user_environment_trains_multi_turn_trajectories(tmp_path):
    env = ["env.name=toy_env:DigitTool", "data.use_chat_template=false"]
    ok(rl_cli(tmp_path, "train", *SFT, f"run.name={RUN}", *env))
    ok(rl_cli(tmp_path, "train", "algo=grpo", f"run.name={RUN}", *RL_SMALL, "train.max_steps=2", *env))
    recs = [r for r in read_metrics(stage_dir(tmp_path, RUN, "grpo")) if "reward" in r]
    assert all(r["turns"] > 1 and r["tool_calls"] > 0 for r in recs), recs
    assert all(0 < r["response_len"] < 24 for r in recs)  # the model's tokens only


def test_an_unknown_environment_is_a_one_line_error(tmp_path):
    proc = rl_cli(tmp_path, "train", "algo=grpo", f"run.name={RUN}", "env.name=nope")
    assert proc.returncode != 0
    assert "unknown environment 'nope'; valid: math, calculator, python, reasoning_gym" in proc.stderr
