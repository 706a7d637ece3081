"""train.fused_loss=liger (rlft/rollout/liger.py): liger-kernel's fused linear losses give the loss and every
gradient of rlft's own chunked head loss to 1e-5 in fp32 (the RL update's ppo_clip + k3 KL with per-token
advantages, importance weights and aggregation weights; SFT's cross-entropy through Triton's interpreter on the
CPU), and what they cannot express is refused in one line."""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest
import torch

from rlft.errors import ConfigError
from rlft.rollout import lm_head
from rlft.rollout.logprobs import packed_logp, token_logp

from helpers import TINY_MODEL, compose_config, require

try:
    import liger_kernel.chunked_loss  # noqa: F401
except ImportError as err:
    require(f"liger-kernel is not installed ({err})", module=True)

from test_lm_head import batch, tiny  # noqa: E402


def policy_terms(logp, t, _divergence=None):
    """rlft's per-token terms as update_policy builds them: ppo_clip (eps 0.2) x is_weight + 0.04 k3, weighted."""
    ratio = torch.exp(logp - t["old"])
    policy = -torch.min(ratio * t["adv"], ratio.clamp(0.8, 1.2) * t["adv"])
    kl = torch.exp(t["ref"] - logp) - (t["ref"] - logp) - 1
    return (policy * t["is_weight"] + 0.04 * kl) * t["weight"]


@pytest.mark.parametrize("kind", ["qwen2-tied", "llama"])
@pytest.mark.parametrize("path", ["padded", "packed", "shared_prompt"])
def test_ligers_policy_loss_equals_rlfts_head_loss(kind, path, monkeypatch):
    """The same TokenLoss through liger's fused GRPO loss and through rlft's head: loss, log-probs, entropies and
    every gradient (tied and untied heads) to 1e-5, with per-token advantages, importance weights, unequal
    aggregation weights and tokens on both sides of the clip range."""
    from rlft.rollout.liger import policy_kernel

    monkeypatch.setattr(lm_head, "DEFAULT_CHUNK_TOKENS", 5)
    model = tiny(kind)
    ids, attn, mask = batch()
    if path == "shared_prompt":
        ids[1, :3] = ids[0, :3]
    g = torch.Generator().manual_seed(2)
    weight = mask * torch.rand(mask.shape, generator=g)
    with torch.no_grad():  # sampling-time log-probs near the model's own, some ratios outside the clip range
        base = token_logp(model, ids, attn, 0.7)
    inputs = {"old": base + 0.3 * torch.randn(mask.shape, generator=g),
              "ref": base + 0.5 * torch.randn(mask.shape, generator=g), "adv": torch.randn(mask.shape, generator=g),
              "is_weight": 0.5 + torch.rand(mask.shape, generator=g),
              "weight": weight / weight.sum()}

    def run(kernel):
        loss = lm_head.TokenLoss(policy_terms, inputs, kernel)
        model.zero_grad()
        if path == "packed":
            logp, more, value = packed_logp(model, ids, attn, mask, 0.7, ("entropy",), loss=loss)
        else:
            logp, more, value = token_logp(model, ids, attn, 0.7, 2 if path == "shared_prompt" else 0,
                                           [3, 3, 3, 3] if path == "shared_prompt" else None, mask, ("entropy",),
                                           loss=loss)
        value.backward()
        return value.detach(), logp, more["entropy"], {n: p.grad.clone() for n, p in model.named_parameters()
                                                       if p.grad is not None}
    want = run(None)
    got = run(policy_kernel(0.2, 0.2, 0.04, 0.7, 5))
    ratio = torch.exp(want[1] - inputs["old"])[mask.bool()]
    assert ((ratio < 0.8) | (ratio > 1.2)).any() and ((ratio > 0.8) & (ratio < 1.2)).any()  # both branches
    torch.testing.assert_close(got[0], want[0], rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(got[1], want[1], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(got[2], want[2], rtol=1e-5, atol=1e-5)
    assert got[3].keys() == want[3].keys() and want[3]
    for name in want[3]:
        torch.testing.assert_close(got[3][name], want[3][name], rtol=1e-5, atol=1e-6, msg=name)


def test_a_head_liger_cannot_read_is_refused_in_one_line():
    """A model that soft-caps its logits and a LoRA-adapted head: one line naming the fix."""
    import peft

    from rlft.rollout.liger import linear_head

    with pytest.raises(ConfigError, match="soft-capping or scaling.*fused_loss=rlft"):
        linear_head(tiny("gemma2-softcap"))
    lora = peft.get_peft_model(tiny("llama"), peft.LoraConfig(r=4, target_modules=["q_proj", "lm_head"]))
    with pytest.raises(ConfigError, match="plain linear LM head.*fused_loss=rlft"):
        linear_head(lm_head.unwrap(lora))
    plain = peft.get_peft_model(tiny("llama"), peft.LoraConfig(r=4, target_modules=["q_proj"]))
    assert type(linear_head(lm_head.unwrap(plain))) is torch.nn.Linear


SFT_CHECK = textwrap.dedent("""
    import torch
    from rlft.rollout import lm_head
    from rlft.rollout.liger import nll_kernel
    from rlft.rollout.logprobs import token_logp
    from rlft.stages.sft import token_nll
    from test_lm_head import batch, tiny

    lm_head.DEFAULT_CHUNK_TOKENS = 5
    model = tiny("{kind}")
    ids, attn, mask = batch()

    def run(kernel):
        model.zero_grad()
        loss = lm_head.TokenLoss(token_nll, {{"weight": mask / mask.sum()}}, kernel)
        logp, more, value = token_logp(model, ids, attn, mask=mask, extras=("top1",), loss=loss)
        value.backward()
        return value.detach(), logp, {{n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}}
    want, got = run(None), run(nll_kernel())
    torch.testing.assert_close(got[0], want[0], rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(got[1], want[1], rtol=1e-5, atol=1e-5)
    assert got[2].keys() == want[2].keys() and want[2]
    for name in want[2]:
        torch.testing.assert_close(got[2][name], want[2][name], rtol=1e-5, atol=1e-6, msg=name)
    print("equal", float(want[0]))
""")


@pytest.mark.parametrize("kind", ["qwen2-tied", "llama"])
def test_ligers_cross_entropy_equals_rlfts_sft_loss(kind):
    """SFT's loss through liger's fused linear cross-entropy (a Triton kernel, run by Triton's interpreter on the
    CPU in a child process) equals rlft's head: loss, log-probs and every gradient to 1e-5."""
    here = os.path.dirname(os.path.abspath(__file__))
    env = dict(os.environ, TRITON_INTERPRET="1", PYTHONPATH=os.pathsep.join([here, os.environ.get("PYTHONPATH", "")]))
    out = subprocess.run([sys.executable, "-c", SFT_CHECK.format(kind=kind)], env=env, capture_output=True,
                         text=True, timeout=600)
    assert out.returncode == 0 and "equal" in out.stdout, out.stderr[-3000:]


@pytest.mark.parametrize("overrides,message", [
    (["algo=grpo", "rollout.top_p=0.9"], "full softmax.*top_k/top_p"),
    (["algo=grpo", "algo.policy_loss=gspo"], "PPO clipped surrogate"),
    (["algo=grpo", "algo.dual_clip_c=3"], "without dual clip"),
    (["algo=grpo", "algo.kl_estimator=k1"], "k3 KL"),
    (["algo=grpo", "deepspeed.zero_stage=3"], "ZeRO-3"),
    (["algo=grpo", "train.logit_chunk_tokens=0"], "logit_chunk_tokens=0"),
    (["algo=dpo"], "serves SFT, RFT and the per-token RL update"),
    (["algo=p3o"], "serves SFT, RFT and the per-token RL update"),
    (["algo=sft"], "needs a GPU"),
])
def test_what_ligers_losses_cannot_express_is_refused_before_the_run(overrides, message, monkeypatch):
    from rlft.config.validate import validate

    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    cfg = compose_config(*overrides, "train.fused_loss=liger", *TINY_MODEL)
    with pytest.raises(ConfigError, match=message):
        validate(cfg)


def test_the_ppo_and_grpo_presets_accept_liger(monkeypatch):
    from rlft.config.validate import validate

    for algo in ("grpo", "ppo", "grpo_process"):
        validate(compose_config(f"algo={algo}", "train.fused_loss=liger", *TINY_MODEL))
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    validate(compose_config("algo=sft", "train.fused_loss=liger", *TINY_MODEL))
