"""Asynchronous sampling's safety and its correction: the sampler (its loop in a thread here) reports the
weights it holds, a sync that did not reach it is an error naming the version, and a stale rollout's loss
is the off-policy loss with the truncated importance weights of the sampler's log-probs
(tests/unit/test_rl_parts.py)."""
from __future__ import annotations

import pytest
import torch

from helpers import TINY_MODEL, compose_config as compose


@pytest.fixture(scope="module")
def policy():
    from rlft.models import load_model, load_tokenizer

    cfg = compose("algo=grpo", "rollout.max_staleness=1", "rollout.engine=hf", "rollout.max_new_tokens=6",
                  *TINY_MODEL)
    tokenizer = load_tokenizer(cfg.model, "builtin:tiny")
    return cfg, tokenizer, load_model(cfg.model, "builtin:tiny", tokenizer, seed=cfg.seed)


def named(model, shift: float = 0.0):
    return [(n, p.detach() + shift) for n, p in model.named_parameters(remove_duplicate=False)]


def sampler(cfg, **kwargs):
    from rlft.rollout.async_sampler import AsyncSampler

    return AsyncSampler(cfg, "builtin:tiny", threads=0, in_process=True, timeout_s=120, **kwargs)


def ask(s, tokenizer, index: int, version: int):
    from rlft.rollout.sampling import Sampling

    ids = [tokenizer.encode("1+2=", add_special_tokens=False)]
    s.ask(index, version, [{"prompt": "1+2="}], ["1+2="], ids, 2, Sampling(max_new_tokens=6), seed=index)


def test_rollouts_come_back_with_the_version_that_sampled_them(policy):
    cfg, tokenizer, model = policy
    s = sampler(cfg)
    try:
        s.push(0, named(model))
        ask(s, tokenizer, 0, 0)
        ask(s, tokenizer, 1, 0)
        s.push(1, named(model, 0.01))
        ask(s, tokenizer, 2, 1)
        for index, version in [(0, 0), (1, 0), (2, 1)]:
            request, gens, seconds = s.take(index)
            assert request.version == version and len(gens.completion_ids) == 2 and seconds >= 0
        with pytest.raises(Exception, match="wants weights version 3, last sent 1"):
            ask(s, tokenizer, 3, 3)
    finally:
        s.close()


def test_a_sync_that_did_not_reach_the_sampler_is_an_error_naming_the_version(policy):
    from rlft.rollout.async_sampler import SamplerError

    cfg, tokenizer, model = policy
    s = sampler(cfg, load=lambda sampler_model, weights: None)  # the sampler drops every weight it is sent
    try:
        s.push(0, named(model))  # its fresh model already equals version 0 (same seed): nothing to notice
        ask(s, tokenizer, 0, 0)
        s.take(0)
        s.push(1, named(model, 0.01))
        ask(s, tokenizer, 1, 1)
        with pytest.raises(SamplerError, match="sync of version 1 are not the trainer's"):
            s.take(1)
    finally:
        s.close()


def test_a_request_for_weights_the_sampler_does_not_hold_is_refused(policy):
    from rlft.rollout.async_sampler import SamplerError
    from rlft.rollout.sampling import Sampling

    cfg, tokenizer, model = policy
    s = sampler(cfg)
    try:
        s.push(0, named(model))
        s.pending[5] = None
        s.inbox.put(("sample", 5, 4, [{}], [[5]], 1, Sampling(max_new_tokens=2), 0))  # version 4 never sent
        with pytest.raises(SamplerError, match="weights version 4, but the sampler holds version 0"):
            s.take(5)
    finally:
        s.close()


def test_on_a_gpu_the_sampler_sees_its_ranks_device_and_its_engine_stays_awake(monkeypatch):
    from rlft.rollout.async_sampler import gpu_environment, sampler_cfg
    from rlft.rollout.generate import ENGINE_SPECS

    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "4,5,6,7")
    assert gpu_environment(torch.device("cuda", 1)) == {"CUDA_VISIBLE_DEVICES": "5"}  # the physical GPU of rank 1
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES")
    assert gpu_environment(torch.device("cuda", 3)) == {"CUDA_VISIBLE_DEVICES": "3"}
    cfg = {"seed": 0, "rollout": {"engine": "vllm", "vllm": {"sleep": True, "gpu_memory_utilization": 0.3}}}
    beside = ENGINE_SPECS["vllm"].beside_trainer
    assert sampler_cfg(cfg, beside)["rollout"]["vllm"] == {"sleep": False, "gpu_memory_utilization": 0.3}
    assert sampler_cfg(cfg, ENGINE_SPECS["hf"].beside_trainer) == cfg
    assert cfg["rollout"]["vllm"]["sleep"] is True  # the trainer's settings are left as they are


def test_a_weight_fingerprint_is_the_same_on_any_thread_count_and_changes_with_an_update():
    """A float64 tensor sum depends on the thread count for a large tensor (a real model's embedding), so the
    sampler (one thread) and the trainer (several) once disagreed on the same weights and stopped the run."""
    from rlft.rollout.async_sampler import fingerprint

    g = torch.Generator().manual_seed(0)
    weights = [("model.embed_tokens.weight", torch.randn(49152, 576, generator=g)),
               ("model.norm.weight", torch.randn(576, generator=g))]
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = fingerprint(weights)
        torch.set_num_threads(2)
        two = fingerprint([(n, t.clone()) for n, t in weights])
    finally:
        torch.set_num_threads(threads)
    assert one == two
    updated = [(n, t + 1e-6 * torch.randn(t.shape, generator=g)) for n, t in weights]  # one small update
    assert fingerprint(updated) != one
