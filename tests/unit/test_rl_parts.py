"""Pieces of the RL loop: global loss denominators, dynamic-sampling merges, metric sums,
iterative RM pairs, offline-RFT de-duplication and a stale (asynchronous) rollout's loss."""
from __future__ import annotations

import math
import os
from types import SimpleNamespace

import pytest
import torch

from rlft import dist
from rlft.algos import AGGREGATIONS, agg_denominator
from rlft.data.labels import outcome_pairs
from rlft.rollout import batch as rb
from rlft.rollout.lm_head import entropy_of
from rlft.stages import experience, rft, rl, update
from rlft.stages.common import Sums

from helpers import TINY_MODEL, compose_config

PAD, EOS = 0, 2


@pytest.fixture(scope="module")
def one_rank():
    """A real gloo process group of world size 1 (rlft.dist.init), torn down afterwards."""
    if dist._INFO is not None:  # another test already joined a group in this process
        yield dist._INFO
        return
    keys = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")
    saved_env = {k: os.environ.get(k) for k in keys}
    threads = torch.get_num_threads()
    info = dist.init(SimpleNamespace(device="cpu", backend="gloo", threads_per_rank=1))
    yield info
    if torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()
    dist._INFO = None
    torch.set_num_threads(threads)
    for k, v in saved_env.items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v


# ----------------------------------------------------------------------------- global_denominator
def test_global_denominator_needs_the_process_group(monkeypatch):
    monkeypatch.setattr(dist, "_INFO", None)
    with pytest.raises(RuntimeError, match=r"dist.init\(\) has not been called"):
        update.global_denominator(torch.ones(2, 3), 8)


def test_global_denominator_counts_on_one_rank(one_rank):
    assert one_rank.world_size == 1 and one_rank.rank == 0
    mask = torch.tensor([[0, 1, 1, 1, 0], [0, 0, 0, 0, 0], [1, 1, 0, 0, 0], [0, 0, 0, 0, 1]], dtype=torch.float32)
    d = update.global_denominator(mask, 24)
    assert (d.num_seqs, d.num_tokens, d.max_len) == (3.0, 6.0, 24.0)  # the all-masked row is not a sequence
    assert d == agg_denominator(mask, 24)
    empty = update.global_denominator(torch.zeros(2, 4), 5)
    assert (empty.num_seqs, empty.num_tokens) == (0.0, 0.0)


@pytest.mark.parametrize("mode", ["seq-mean-token-mean", "token-mean", "seq-mean-token-sum", "constant-norm"])
def test_micro_batch_losses_with_the_global_denominator_add_up_to_the_batch_loss(one_rank, mode):
    g = torch.Generator().manual_seed(0)
    loss = torch.randn(8, 6, generator=g, dtype=torch.float64)
    lengths = [6, 1, 3, 0, 2, 5, 4, 6]
    mask = torch.tensor([[1.0] * n + [0.0] * (6 - n) for n in lengths], dtype=torch.float64)
    fn = AGGREGATIONS.get(mode)
    denom = update.global_denominator(mask, 6)
    full = fn(loss, mask, denom)
    for micro in (1, 2, 3, 8):
        parts = sum(fn(loss[i:i + micro], mask[i:i + micro], denom) for i in range(0, 8, micro))
        assert abs(float(parts) - float(full)) < 1e-12, (micro, float(parts), float(full))
    # local (per-micro-batch) counts would give a different loss: the check above has power
    local = sum(fn(loss[i:i + 2], mask[i:i + 2], None) for i in range(0, 8, 2))
    assert abs(float(local) - float(full)) > 1e-3


# ----------------------------------------------------------------------------- Sums and metrics
def test_sums_reduce_to_weighted_means(one_rank):
    s = Sums()
    s.add("kl", 3.0, 2)
    s.add("kl", 1.0, 2)
    s.add("entropy", 5.0, 10)
    s.add("never", 0.0, 0)
    assert s.reduce() == {"entropy": 0.5, "kl": 1.0, "never": 0.0}


def test_entropy_matches_the_definition():
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(5, 3, 11, generator=g)
    p = torch.softmax(logits.double(), -1)
    want = -(p * p.log()).sum(-1)
    got = entropy_of(logits, torch.logsumexp(logits, -1))
    assert got.shape == (5, 3) and (got.double() - want).abs().max().item() < 1e-5
    zeros = torch.zeros(1, 1, 11)
    assert abs(entropy_of(zeros, torch.logsumexp(zeros, -1)).item() - torch.log(torch.tensor(11.0)).item()) < 1e-5


def test_rollout_metrics(one_rank):
    ro = _rollout([1.0, 0.0, 1.0, 1.0], truncated=[True, False, False, False])
    stats = Sums()
    rl.rollout_metrics(ro, stats, 2)
    out = stats.reduce()
    assert out["reward"] == 0.75 and out["reward_sq"] == 0.75
    assert out["truncated_frac"] == 0.25
    assert out["frac_zero_std"] == 0.5  # group 1 (1, 1) has zero std, group 0 (1, 0) does not
    assert out["reward/correctness"] == 0.75
    assert out["response_len"] == pytest.approx(sum(len(c) for c in ro.completion_ids) / 4)


# ----------------------------------------------------------------------------- merge_informative
def _rollout(scores, truncated=None, tag="a"):
    n = len(scores)
    prompts = [[10 + i // 2] for i in range(n)]
    comps = [[20 + i] * (1 + i % 3) + [EOS] for i in range(n)]
    ids, attn, mask = rb.build_sequences(prompts, comps, PAD)
    return rb.Rollout(rows=[{"prompt": f"{tag}{i // 2}"} for i in range(n)],
                      prompt_texts=[f"{tag}{i // 2}" for i in range(n)],
                      completions=[f"{tag}{i}" for i in range(n)], completion_ids=comps, input_ids=ids,
                      attention_mask=attn, mask=mask, truncated=torch.tensor(truncated or [False] * n),
                      prompt_lens=[1] * n, scores=torch.tensor(scores, dtype=torch.float64),
                      per_source={"correctness": list(map(float, scores))})


def test_merge_informative_replaces_all_equal_groups():
    G = 2
    ro = _rollout([1.0, 0.0, 0.0, 0.0, 1.0, 1.0], tag="a")      # groups: informative, flat, flat
    extra = _rollout([0.0, 0.0, 0.5, 0.0, 1.0, 0.0], tag="b")   # groups: flat, informative, informative
    keep = torch.tensor([True, False, False])
    keep_extra = torch.tensor([False, True, True])
    out = experience.merge_informative(ro, extra, keep, keep_extra, G, PAD)
    assert out.completions == ["a0", "a1", "b2", "b3", "b4", "b5"]
    assert out.scores.tolist() == [1.0, 0.0, 0.5, 0.0, 1.0, 0.0]
    assert len(out) == len(ro)
    # groups stay contiguous and each keeps its own prompt
    assert [r["prompt"] for r in out.rows] == ["a0", "a0", "b1", "b1", "b2", "b2"]


def test_merge_informative_fills_up_with_flat_groups_when_short():
    ro = _rollout([0.0, 0.0, 1.0, 0.0], tag="a")       # flat, informative
    extra = _rollout([1.0, 1.0, 0.0, 0.0], tag="b")    # flat, flat
    out = experience.merge_informative(ro, extra, torch.tensor([False, True]), torch.tensor([False, False]), 2, PAD)
    assert out.completions == ["a2", "a3", "a0", "a1"]


# ----------------------------------------------------------------------------- iterative RL pairs
def _rec(prompt, completion, correct):
    return {"prompt": prompt, "prompt_text": prompt + "\nA:\n", "completion": completion, "gold": "3",
            "correct": correct}


def test_rm_pairs_pair_correct_with_incorrect_within_each_group():
    records = [_rec("p0", "good0", True), _rec("p0", "bad0", False), _rec("p0", "bad1", False),
               _rec("p0", "good1", True),
               _rec("p1", "x", False), _rec("p1", "y", False), _rec("p1", "z", False), _rec("p1", "w", False),
               _rec("p2", "g", True), _rec("p2", "h", True), _rec("p2", "i", True), _rec("p2", "j", False)]
    pairs = outcome_pairs(records, 4)
    assert [(p["chosen"], p["rejected"]) for p in pairs] == [("good0", "bad0"), ("good1", "bad1"), ("g", "j")]
    assert [p["prompt_text"] for p in pairs] == ["p0\nA:\n", "p0\nA:\n", "p2\nA:\n"]


def test_rm_pairs_never_cross_groups():
    records = [_rec("p0", "good", True), _rec("p0", "good2", True), _rec("p1", "bad", False), _rec("p1", "bad2", False)]
    assert outcome_pairs(records, 2) == []


# ----------------------------------------------------------------------------- offline RFT
def test_dedupe_keeps_first_occurrence_in_order():
    samples = [(0, "a"), (1, "a"), (0, "a"), (0, "b"), (1, "a"), (2, "c"), (0, "b")]
    assert rft.dedupe(samples) == [(0, "a"), (1, "a"), (0, "b"), (2, "c")]
    assert rft.dedupe([]) == []


# ----------------------------------------------------------------------------- engine-mismatch correction
@pytest.mark.parametrize("correction", ["tis", "mis", "none"])
def test_prepare_applies_the_engine_mismatch_correction(one_rank, correction):
    """Experience.prepare with the engine's log-probs equal to the trainer's except one token, whose
    engine log-prob is 2 nats lower (ratio e^2 > C = 2): tis truncates that token's weight to 2, mis
    drops it from the mask (so from the loss and its counts); the gap metrics name it. With none and
    a rollout used once, the trainer's pi_old is not computed at all."""
    from omegaconf import OmegaConf
    from transformers import LlamaConfig, LlamaForCausalLM

    from rlft.config.algorithms import RLConfig
    from rlft.config.schema import Config

    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(vocab_size=40, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                         num_attention_heads=1, num_key_value_heads=1)).eval()
    policy = type("Policy", (), {"device": torch.device("cpu"), "module": model,
                                 "__call__": lambda self, **kw: model(**kw)})()
    ro = _rollout([1.0, 0.0, 1.0, 1.0])
    trainer = experience.rollout_logp(policy, ro, 4, 1.0)
    ro.sampler_logp = [trainer[i][ro.mask[i].bool()].tolist() for i in range(4)]
    ro.sampler_logp[1][0] -= 2.0
    cfg = OmegaConf.structured(Config)
    cfg.algo = OmegaConf.structured(RLConfig)
    cfg.rollout.samples_per_prompt, cfg.algo.kl_coef = 2, 0.0
    cfg.train.micro_batch_per_device = 4
    exp = experience.Experience(cfg, one_rank, None, policy, is_correction=correction)
    mask_before = ro.mask.clone()
    exp.prepare(ro, kl_coef=0.0)
    col = ro.prompt_lens[1] - 1  # the first completion token of row 1
    if correction == "none":
        assert ro.get("old_logp") is None and ro.get("is_weight") is None and torch.equal(ro.mask, mask_before)
        return
    assert float(ro.metrics["engine_logp_gap_max"]) == pytest.approx(2.0, abs=1e-5)
    if correction == "tis":
        assert float(ro.get("is_weight")[1, col]) == 2.0 and torch.equal(ro.mask, mask_before)
        assert float(ro.metrics["is_corrected_frac"]) == pytest.approx(1 / float(mask_before.sum()))
    else:
        assert float(ro.mask[1, col]) == 0.0 and float((mask_before - ro.mask).sum()) == 1.0


@pytest.mark.parametrize("algo, has_reference, correction, want", [
    (dict(advantage="grpo"), True, "none", {"adv", "ref_logp"}),  # mu=1: the ratio's pi_old is the forward's own
    (dict(advantage="grpo"), False, "tis", {"adv", "old_logp", "is_weight"}),  # vLLM's log-probs corrected
    (dict(advantage="grpo", updates_per_rollout=2), True, "none", {"adv", "old_logp", "ref_logp"}),
    (dict(advantage="grpo_process"), True, "none", {"adv", "ref_logp", "step_ends", "step_scores"}),
    (dict(advantage="gae", kl_in="reward"), True, "none", {"adv", "old_logp", "ref_logp", "values", "returns"}),
    (dict(pairwise_loss="p3o_joint"), True, "none", {"old_logp", "ref_logp", "pair_scores", "pair_s_ref", "delta"}),
])
def test_a_rollout_carries_what_its_estimator_or_loss_declares(algo, has_reference, correction, want):
    from omegaconf import OmegaConf

    from rlft.config.algorithms import RLConfig

    a = OmegaConf.merge(OmegaConf.structured(RLConfig), algo)
    assert experience.rollout_needs(a, has_reference, correction) == want
    assert want <= set(rb.EXTRAS)


def test_each_rollout_engine_declares_its_default_correction():
    """rollout.is_correction=auto takes what the engine declares; nothing asks an engine's name."""
    from rlft.rollout import generate, sampling
    from rlft.rollout.vllm_engine import VLLMEngine

    assert set(generate.ENGINE_SPECS) == set(sampling.ENGINES) - {"auto"}
    assert generate.HFEngine.default_is_correction == "none" and VLLMEngine.default_is_correction == "tis"
    cfg = SimpleNamespace(rollout=SimpleNamespace(is_correction="auto", max_staleness=0))
    assert experience.is_correction(cfg, SimpleNamespace(default_is_correction="tis")) == "tis"
    assert experience.is_correction(cfg, SimpleNamespace(default_is_correction="none")) == "none"
    cfg.rollout.max_staleness = 1  # asynchronous: the sampler's weights lag, whatever its engine
    assert experience.is_correction(cfg, SimpleNamespace(default_is_correction="none")) == "tis"
    cfg.rollout.is_correction = "mis"
    assert experience.is_correction(cfg, SimpleNamespace(default_is_correction="tis")) == "mis"


class CapturingPolicy:
    """The model as the update's policy: records each loss it is asked to backpropagate."""

    def __init__(self, module):
        self.module, self.device, self.losses = module, torch.device("cpu"), []

    def __call__(self, *args, **kwargs):
        return self.module(*args, **kwargs)

    def backward(self, loss, last=True):
        self.losses.append(float(loss.detach()))

    def step(self):
        pass


def test_a_stale_rollouts_loss_is_the_off_policy_loss_with_truncated_weights(one_rank):
    """K = 1: the rollout was sampled by the previous weights (the sampler's log-probs mu), the update's ratio
    is against pi_old (the current weights), each token weighted by min(pi_old / mu, C). At the first
    optimizer step the ratio is 1, so the loss is -(1/N) sum_i A_i mean_t min(exp(old_it - mu_it), C)."""
    from rlft.algos import IS_CORRECTIONS, ISConfig
    from rlft.models import load_model, load_tokenizer

    from rlft.config.validate import validate

    cfg = compose_config("algo=grpo", "rollout.samples_per_prompt=2", "algo.kl_coef=0", *TINY_MODEL)
    validate(cfg)  # the defaults table's rates and sizes
    tokenizer = load_tokenizer(cfg.model, "builtin:tiny")
    model = load_model(cfg.model, "builtin:tiny", tokenizer, seed=cfg.seed)
    prompt, completions = [5, 6, 7], [[8, 9, 10, 2], [11, 12, 2]]
    ids, attn, mask = rb.build_sequences([prompt, prompt], completions, tokenizer.pad_token_id)
    ro = rb.Rollout(rows=[{}, {}], prompt_texts=["", ""], completions=["", ""], completion_ids=completions,
                    input_ids=ids, attention_mask=attn, mask=mask, truncated=torch.tensor([False, False]),
                    prompt_lens=[3, 3])
    fake = CapturingPolicy(model)
    old = experience.rollout_logp(fake, ro, 8, 1.0)
    shifts = torch.tensor([[0.3, -0.2, 1.5, 0.0], [-0.4, 0.9, 0.1, 0.0]])  # log(pi_old / mu) on the response
    mu = old.clone()
    for i, completion in enumerate(completions):
        cols = mask[i].nonzero().flatten()
        mu[i, cols] = old[i, cols] - shifts[i, :len(completion)]
    weight, _, _ = IS_CORRECTIONS.get("tis")(old, mu, mask, ISConfig("token", 2.0))
    adv = torch.tensor([[1.0], [-0.5]]).expand_as(mask).clone()
    ro.put(old_logp=old, is_weight=weight, adv=adv)
    stats = Sums()
    update.update_policy(fake, ro, stats, update.Shape.of(cfg), kl_coef=0.0)
    logged = stats.reduce()  # every metric the policy loss returns, as its token-weighted mean
    assert {"clipfrac", "clipfrac_dual", "ratio_mean", "approx_kl", "entropy"} <= set(logged)
    assert logged["ratio_mean"] == pytest.approx(1.0) and logged["approx_kl"] == pytest.approx(0.0, abs=1e-7)
    by_hand = -sum(a * sum(min(math.exp(s), 2.0) for s in shifts[i, :len(c)].tolist()) / len(c)
                   for i, (a, c) in enumerate(zip([1.0, -0.5], completions))) / 2
    assert fake.losses == pytest.approx([by_hand], rel=1e-6)


def test_every_n_steps_is_kept_when_a_unit_is_several_steps():
    """A PPO rollout is 4 optimizer steps: eval_every=50 evaluates at the ends of the rollouts that pass 50, 100,
    150 (steps 52, 100, 152), not only at the common multiples of 4, 10 and 50 (100, 200)."""
    from rlft.stages.common import crossed

    ends = range(4, 201, 4)
    assert [d for d in ends if crossed(d, 4, 50)] == [52, 100, 152, 200]
    assert [d for d in range(1, 11) if crossed(d, 1, 5)] == [5, 10]  # one step a unit: every multiple, as before
    assert not any(crossed(d, 4, 0) for d in ends)  # 0: never


def test_iterative_prm_retraining_weighs_steps_as_the_prm_stage_did(tmp_path):
    """The PRM's algo.good_step_weight (from the config.yaml beside its final/) is the retraining loss's too; the
    RM and PRM stages and the retraining share one loss definition (reward_loss)."""
    from rlft.stages.iterative import trained_good_step_weight
    from rlft.stages.reward import prm_loss, reward_loss, rm_loss, step_count

    (tmp_path / "prm" / "final").mkdir(parents=True)
    (tmp_path / "prm" / "config.yaml").write_text("algo:\n  name: prm\n  good_step_weight: 2.5\n")
    assert trained_good_step_weight(str(tmp_path / "prm" / "final")) == 2.5
    assert trained_good_step_weight(str(tmp_path / "elsewhere")) == 1.0
    loss, count = reward_loss("prm", 2.5)
    assert loss.func is prm_loss and loss.keywords == {"good_weight": 2.5} and count is step_count
    assert reward_loss("rm") == (rm_loss, len)


class GradPolicy(CapturingPolicy):
    """CapturingPolicy whose backward runs: the gradients of every micro-batch loss accumulate in the module."""

    def backward(self, loss, last=True):
        super().backward(loss, last)
        loss.backward()


@pytest.mark.parametrize("loss,agg", [("ppo_clip", "seq-mean-token-mean"), ("ppo_clip", "token-mean"),
                                      ("ppo_clip", "constant-norm"), ("reinforce", "seq-mean-token-sum"),
                                      ("gspo", "seq-mean-token-mean")])
def test_a_per_token_loss_through_the_head_updates_as_the_log_prob_loss_does(one_rank, loss, agg, monkeypatch):
    """update_policy hands a `per_token` policy loss (with is_weight, the k3 KL in the loss and its aggregation's
    weights) to the LM head, which differentiates it in the forward, two tokens a chunk: the loss, every metric
    and every gradient equal the same update with the chunks recomputed in the backward and with the model's own
    logits (gspo, not per-token, takes the log-prob path in all three)."""
    from rlft.models import load_model, load_tokenizer
    from rlft.rollout import lm_head

    from rlft.config.validate import validate

    cfg = compose_config("algo=grpo", "rollout.samples_per_prompt=2", "algo.kl_coef=0.05", f"algo.policy_loss={loss}",
                         f"algo.loss_agg={agg}", *TINY_MODEL)
    validate(cfg)
    tokenizer = load_tokenizer(cfg.model, "builtin:tiny")
    prompt, completions = [5, 6, 7], [[8, 9, 10, 2], [11, 12, 2], [13, 14, 15, 16, 2], [9, 2]]
    ids, attn, mask = rb.build_sequences([prompt] * 4, completions, tokenizer.pad_token_id)
    g = torch.Generator().manual_seed(3)
    ro = rb.Rollout(rows=[{}] * 4, prompt_texts=[""] * 4, completions=[""] * 4, completion_ids=completions,
                    input_ids=ids, attention_mask=attn, mask=mask, truncated=torch.tensor([False] * 4),
                    prompt_lens=[3] * 4)
    ro.put(old_logp=-torch.rand(mask.shape, generator=g) * 2, ref_logp=-torch.rand(mask.shape, generator=g) * 2,
           is_weight=0.5 + torch.rand(mask.shape, generator=g), adv=torch.randn(4, 1, generator=g).expand_as(mask).clone())

    def run(chunk, fused):
        monkeypatch.setattr(lm_head, "DEFAULT_CHUNK_TOKENS", chunk)
        monkeypatch.setattr(lm_head, "FUSED", fused)
        model = load_model(cfg.model, "builtin:tiny", tokenizer, seed=cfg.seed)
        policy, stats = GradPolicy(model), Sums()
        update.update_policy(policy, ro, stats, update.Shape.of(cfg), kl_coef=0.05)
        return policy.losses, stats.reduce(), {n: p.grad.clone() for n, p in model.named_parameters()
                                               if p.grad is not None}
    want = run(0, True)
    for got in (run(2, True), run(2, False)):
        assert got[0] == pytest.approx(want[0], rel=1e-5)
        assert got[1].keys() == want[1].keys()
        assert all(got[1][k] == pytest.approx(want[1][k], rel=1e-5, abs=1e-6) for k in want[1])
        assert got[2].keys() == want[2].keys() and want[2]
        for name in want[2]:
            torch.testing.assert_close(got[2][name], want[2][name], rtol=1e-5, atol=1e-6, msg=name)


@pytest.mark.parametrize("agg", ["seq-mean-token-mean", "token-mean", "constant-norm"])
def test_ligers_fused_loss_updates_as_rlfts_head_does(one_rank, agg, monkeypatch):
    """train.fused_loss=liger: update_policy hands liger's fused GRPO loss the same per-token advantages (here
    different for every token), importance weights, k3 KL and aggregation weights: the micro-batch losses, every
    logged metric and every gradient equal rlft's own head's (1e-5)."""
    pytest.importorskip("liger_kernel.chunked_loss")
    from rlft.config.validate import validate
    from rlft.models import load_model, load_tokenizer
    from rlft.rollout import lm_head
    from rlft.rollout.logprobs import token_logp

    monkeypatch.setattr(lm_head, "DEFAULT_CHUNK_TOKENS", 3)
    prompt, completions = [5, 6, 7], [[8, 9, 10, 2], [11, 12, 2], [13, 14, 15, 16, 2], [9, 2]]

    def run(fused):
        cfg = compose_config("algo=grpo", "rollout.samples_per_prompt=2", "algo.kl_coef=0.05", f"algo.loss_agg={agg}",
                             f"train.fused_loss={fused}", "train.micro_batch_per_device=2", *TINY_MODEL)
        validate(cfg)
        tokenizer = load_tokenizer(cfg.model, "builtin:tiny")
        ids, attn, mask = rb.build_sequences([prompt] * 4, completions, tokenizer.pad_token_id)
        model = load_model(cfg.model, "builtin:tiny", tokenizer, seed=cfg.seed)
        with torch.no_grad():
            base = token_logp(model, ids, attn) * mask
        g = torch.Generator().manual_seed(3)
        ro = rb.Rollout(rows=[{}] * 4, prompt_texts=[""] * 4, completions=[""] * 4, completion_ids=completions,
                        input_ids=ids, attention_mask=attn, mask=mask, truncated=torch.tensor([False] * 4),
                        prompt_lens=[3] * 4)
        ro.put(old_logp=base + 0.6 * torch.randn(mask.shape, generator=g),
               ref_logp=base + 0.5 * torch.randn(mask.shape, generator=g),
               is_weight=0.5 + torch.rand(mask.shape, generator=g), adv=torch.randn(mask.shape, generator=g))
        policy, stats = GradPolicy(model), Sums()
        update.update_policy(policy, ro, stats, update.Shape.of(cfg), kl_coef=0.05)
        return policy.losses, stats.reduce(), {n: p.grad.clone() for n, p in model.named_parameters()
                                               if p.grad is not None}
    want, got = run("rlft"), run("liger")
    assert len(want[0]) == 2 and got[0] == pytest.approx(want[0], rel=1e-5)
    assert 0 < want[1]["clipfrac"] < 1 and got[1].keys() == want[1].keys()
    assert all(got[1][k] == pytest.approx(want[1][k], rel=1e-5, abs=1e-6) for k in want[1])
    assert got[2].keys() == want[2].keys() and want[2]
    for name in want[2]:
        torch.testing.assert_close(got[2][name], want[2][name], rtol=1e-5, atol=1e-6, msg=name)
