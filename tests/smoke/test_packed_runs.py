"""train.packing on real runs: SFT, DPO and GRPO (scoring and update passes) trained with padding-free
forwards follow the padded runs' curves and end at the same weights (up to floating-point order); the
padding fraction of the update forwards is logged. Forwards cut by a token budget
(train.max_tokens_per_micro_batch) end at the same weights too, and so do the padded runs that take the
model's own logits instead of running the LM head a chunk at a time (train.logit_chunk_tokens=0)."""
from __future__ import annotations

import pytest
import torch

from helpers import RL_SMALL, USER_REWARD, check_ok, load_safetensors, make_parents, read_metrics, rl_cli

RUN = "pk"
SMALL = ["train.batch_size=8", "train.micro_batch_per_device=4", "train.log_every=1", "train.save_every=0",
         "train.lr=1e-2"]


VARIANTS = {"false": ["train.packing=false", "train.logit_chunk_tokens=16"],  # the LM head over several chunks
            "true": ["train.packing=true"],
            # packed forwards cut by a token budget instead of micro_batch_per_device
            "tokens": ["train.packing=true", "train.max_tokens_per_micro_batch=200"],
            "whole_logits": ["train.packing=false", "train.logit_chunk_tokens=0"]}


def both(tmp_path, algo: str, *args) -> tuple[list[dict], list[dict], dict, dict]:
    """(padded metrics, packed metrics, padded weights, packed weights); the token-budget run is
    checked against the packed one here, the whole-logits one against the padded one."""
    out = {}
    for name, over in VARIANTS.items():
        d = f"runs/{RUN}/{algo}_{name}"
        check_ok(rl_cli(tmp_path, "train", f"algo={algo}", f"run.name={RUN}", f"run.dir={d}", *args, *over))
        out[name] = (read_metrics(tmp_path / d), load_safetensors(tmp_path / d / "final"))
    (m_pad, w_pad), (m_pack, w_pack), (m_tok, w_tok) = out["false"], out["true"], out["tokens"]
    same_weights(w_pack, w_tok)
    same_weights(w_pad, out["whole_logits"][1])
    forwards = [r["micro_batches"] for r in m_tok if "micro_batches" in r]
    assert forwards and forwards != [r["micro_batches"] for r in m_pack if "micro_batches" in r], forwards
    return m_pad, m_pack, w_pad, w_pack


def same_curves(padded: list[dict], packed: list[dict], keys: list[str]) -> None:
    pad = [r for r in padded if keys[0] in r]
    pck = [r for r in packed if keys[0] in r]
    assert len(pad) == len(pck) > 1
    for a, b in zip(pad, pck):
        for k in keys:
            assert b[k] == pytest.approx(a[k], rel=1e-4, abs=1e-5), (k, a["step"])


def same_weights(a: dict, b: dict) -> None:
    for k in a:
        torch.testing.assert_close(b[k], a[k], rtol=1e-4, atol=1e-5, msg=k)


def test_packed_sft_and_dpo_follow_the_padded_runs(tmp_path):
    m_pad, m_pack, w_pad, w_pack = both(tmp_path, "sft", "train.max_steps=3", *SMALL)
    same_curves(m_pad, m_pack, ["loss", "token_acc"])
    same_weights(w_pad, w_pack)
    check_ok(rl_cli(tmp_path, "train", "algo=sft", f"run.name={RUN}", "train.max_steps=2", *SMALL))
    m_pad, m_pack, w_pad, w_pack = both(tmp_path, "dpo", "train.max_steps=3", *SMALL)
    same_curves(m_pad, m_pack, ["loss", "margin"])
    same_weights(w_pad, w_pack)


def test_packed_grpo_follows_the_padded_run(tmp_path):
    make_parents(tmp_path, RUN, ("sft",))
    args = [*RL_SMALL, "train.max_steps=4", "train.lr=1e-2", f"reward.functions=[{USER_REWARD}:alternate]",
            "algo.updates_per_rollout=2"]  # old log-probs from a scoring pass, then two updates
    m_pad, m_pack, w_pad, w_pack = both(tmp_path, "grpo", *args)
    same_curves(m_pad, m_pack, ["reward", "kl", "entropy", "clipfrac", "response_len"])
    same_weights(w_pad, w_pack)
    assert all(r["padding_frac"] > 0 for r in m_pad if "padding_frac" in r)  # ragged completions
    assert all(r["padding_frac"] == 0 for r in m_pack if "padding_frac" in r)
