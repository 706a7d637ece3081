"""Online RL end to end through the CLI: GRPO (outcome, process, iterative, RM reward with
dynamic sampling, no reference), online RFT and offline RFT, a few optimizer steps each.

A module fixture trains this run's parents once (SFT 3 steps, RM and PRM 2 steps from it);
every test copies them into its own tmp dir, so each RL stage writes the standard layout
runs/rl/<algo>/ without racing the others. The random-init policy never answers correctly,
so runs that must move the weights add a user reward with non-zero group std
(tests/data/rl_user_reward.py, imported as `rl_user_reward:<fn>`).
"""
from __future__ import annotations

import json
import math
import shutil

import pytest

from helpers import (RL_SMALL, TINY, USER_REWARD, assert_finite, changed_tensors, explain, load_safetensors,
                     make_parents, one_line_error, read_manifest, read_metrics, rl_cli, run_cli, stage_dir)

RUN = "rl"


@pytest.fixture(scope="module")
def parents(tmp_path_factory):
    root = tmp_path_factory.mktemp("rl_parents")
    make_parents(root, RUN, ("sft", "rm", "prm"))
    return root


@pytest.fixture
def work(parents, tmp_path):
    """tmp_path holding a copy of the parents (runs/rl/{sft,rm,prm})."""
    shutil.copytree(parents / "runs", tmp_path / "runs")
    return tmp_path


def train(work, *args, timeout=300, rollout=True):
    proc = rl_cli(work, "train", f"run.name={RUN}", *(RL_SMALL if rollout else ()), *args, timeout=timeout)
    assert proc.returncode == 0, explain(proc)
    return proc


def rl_records(directory):
    return [r for r in read_metrics(directory) if "reward" in r]


def check_outputs(work, algo: str, *, all_changed: bool, parent: str = "sft") -> dict:
    """manifest, final/ loadable with transformers, weights moved away from the parent's."""
    from transformers import AutoModelForCausalLM

    out = stage_dir(work, RUN, algo)
    manifest = read_manifest(out)
    assert manifest["completed"] is True and manifest["stage"] == algo
    assert manifest["parent"].endswith(f"{RUN}/{parent}/final")
    model = AutoModelForCausalLM.from_pretrained(out / "final")
    assert sum(p.numel() for p in model.parameters()) > 0
    before, after = load_safetensors(stage_dir(work, RUN, parent) / "final"), load_safetensors(out / "final")
    assert set(before) == set(after)
    changed = changed_tensors(before, after)
    assert changed, "no parameter tensor changed"
    if all_changed:  # every tensor receives gradient in these runs
        assert changed == sorted(before), sorted(set(before) - set(changed))
    return manifest


def check_rl_metrics(work, algo: str, steps: int, kl: bool) -> list[dict]:
    recs = rl_records(stage_dir(work, RUN, algo))
    assert [r["step"] for r in recs] == list(range(1, steps + 1))
    for key in ("reward", "entropy", "response_len", "reward_std", "frac_zero_std", "clipfrac"):
        assert_finite(r[key] for r in recs)
    assert all(0 < r["entropy"] < math.log(100) + 1e-6 for r in recs)  # char vocabulary: 100 tokens
    if kl:
        assert_finite(r["kl"] for r in recs)
        assert all(r["kl"] >= 0 for r in recs)
    else:
        assert all("kl" not in r for r in recs)  # kl_coef=0: no reference model, no KL
    evals = [r for r in read_metrics(stage_dir(work, RUN, algo)) if "eval_greedy_accuracy" in r]
    assert evals and 0.0 <= evals[-1]["eval_greedy_accuracy"] <= 1.0
    return recs


ALTERNATE = f"{USER_REWARD}:alternate"


# ----------------------------------------------------------------------------- GRPO
def test_grpo_outcome_rule_reward(work):
    train(work, "algo=grpo", "train.max_steps=2", f"reward.functions=[correctness,{ALTERNATE}]",
          "reward.weights=[1.0,0.5]", "train.lr=1e-3")
    recs = check_rl_metrics(work, "grpo", 2, kl=True)
    for r in recs:
        assert r["reward/correctness"] == 0.0  # the tiny policy never answers correctly
        assert r[f"reward/{ALTERNATE}"] == 0.5
        assert r["reward"] == pytest.approx(0.25)
        assert r["frac_zero_std"] == 0.0
    assert recs[0]["kl"] < 1e-7          # policy == reference at the first update
    assert recs[1]["kl"] > 1e-6          # the first update moved the policy away from it
    check_outputs(work, "grpo", all_changed=True)


def test_a_reward_that_raises_mid_run_names_itself_the_step_and_the_checkpoint(work):
    proc = rl_cli(work, "train", "algo=grpo", f"run.name={RUN}", *RL_SMALL, "train.max_steps=3", "train.save_every=1",
                  f"reward.functions=[{USER_REWARD}:fails_in_the_second_rollout]")
    line = one_line_error(proc)
    checkpoint = f"runs/{RUN}/grpo/checkpoints/step-0000001"
    assert line == (f"rlft: error: reward '{USER_REWARD}:fails_in_the_second_rollout' raised ZeroDivisionError: "
                    f"division by zero; in rollout 2 (step 1); last checkpoint {checkpoint}; fix it and continue "
                    "with the same command and resume=true"), line


def test_grpo_process_supervision_with_the_prm(work):
    train(work, "algo=grpo_process", "train.max_steps=2", "train.lr=1e-3")  # its own preset: beta 1
    recs = check_rl_metrics(work, "grpo_process", 2, kl=True)
    assert all(r["kl_coef"] == 1.0 for r in recs)
    # the outcome reward is flat (never correct), so only the PRM's step rewards can move the policy
    assert all(r["reward"] == 0.0 and r["frac_zero_std"] == 1.0 for r in recs)
    check_outputs(work, "grpo_process", all_changed=True)


def test_grpo_process_min_with_the_exact_step_verifier_and_a_sample_budget(work):
    shutil.rmtree(stage_dir(work, RUN, "prm"))  # the exact verifier needs no PRM
    # a budget of 40 completions: 3 rollouts of 4 x 4 (the fewest that reach it)
    # min-form credit (grpo_process_min) reads the same step scores
    train(work, "algo=grpo", "algo.advantage=grpo_process_min", "reward.process=exact", "train.max_samples=40")
    recs = check_rl_metrics(work, "grpo", 3, kl=True)
    assert [r["samples_seen"] for r in recs] == [16, 32, 48]
    assert read_manifest(stage_dir(work, RUN, "grpo"))["summary"]["samples_seen"] == 48
    if all(r["frac_zero_std"] == 1.0 for r in recs):
        # the 3-step SFT model writes no checkable step, so every group's step rewards are equal: no signal,
        # and with the policy still at the reference no KL gradient either; the update must then be exactly
        # nothing (a numerical mismatch between the policy's and the reference's log-probs would show here)
        before = load_safetensors(stage_dir(work, RUN, "sft") / "final")
        after = load_safetensors(stage_dir(work, RUN, "grpo") / "final")
        assert not changed_tensors(before, after)
    else:
        check_outputs(work, "grpo", all_changed=False)


def test_iterative_grpo_retrains_the_prm_and_resets_the_reference(work):
    from transformers import AutoModelForCausalLM, AutoModelForTokenClassification

    # the PRM stage kept its training rows (as algo.source=policy does): the retraining replays them
    kept = {"prompt_text": "Q: Ann has 2 cups.\nA:\n", "steps": ["2+1=3", "#### 3"], "labels": [1, 1]}
    (stage_dir(work, RUN, "prm") / "train_data.jsonl").write_text(json.dumps(kept) + "\n")
    proc = train(work, "algo=grpo", "iterative.iterations=2", "reward=prm", "train.max_steps=2", "train.lr=1e-3",
                 "iterative.rm_steps=2", timeout=400)
    assert "'prm_replay_examples': 1" in proc.stdout + proc.stderr
    recs = check_rl_metrics(work, "grpo", 2, kl=True)
    assert [r["iteration"] for r in recs] == [0, 1]
    assert_finite(r["reward/prm"] for r in recs)
    # iteration 1 starts with reference = policy, so its first KL is exactly 0 again
    assert recs[1]["kl"] < 1e-7
    it0 = stage_dir(work, RUN, "grpo") / "iterations" / "iter-0"
    assert (it0 / "policy" / "config.json").is_file() and (it0 / "prm" / "config.json").is_file()
    AutoModelForCausalLM.from_pretrained(it0 / "policy")
    AutoModelForTokenClassification.from_pretrained(it0 / "prm")
    added = [json.loads(x) for x in (it0 / "prm_train_data.jsonl").read_text().splitlines()]  # a later replay's
    assert added and all(len(r["steps"]) == len(r["labels"]) for r in added)
    prm_before, prm_after = load_safetensors(stage_dir(work, RUN, "prm") / "final"), load_safetensors(it0 / "prm")
    assert changed_tensors(prm_before, prm_after), "the PRM was not retrained"
    policy0 = load_safetensors(it0 / "policy")
    assert changed_tensors(load_safetensors(stage_dir(work, RUN, "sft") / "final"), policy0)
    check_outputs(work, "grpo", all_changed=True)


def test_grpo_with_the_rm_and_dynamic_sampling(work):
    train(work, "algo=grpo", "reward=rm", "rollout.dynamic_sampling=true", "train.max_steps=2", "train.lr=1e-3")
    recs = check_rl_metrics(work, "grpo", 2, kl=True)
    assert_finite(r["reward/rm"] for r in recs)
    assert all(r["reward_std"] > 0 for r in recs)  # RM scores are continuous
    check_outputs(work, "grpo", all_changed=True)


def expected_zero_std(cfg, rollout: int, rounds: int) -> tuple[float, float]:
    """(share of flat groups before refilling, after) for half_flat, replaying the prompt draw."""
    from rl_user_reward import half_flat
    from rlft.stages import common, inputs

    rows = inputs.qa_rows(cfg, "train")
    P = cfg.rollout.prompts_per_step

    def prompts(offset):
        return [rows[i]["prompt"] for i in common.step_indices(rollout, P, len(rows), cfg.seed + offset)]

    def informative(ps):
        return [half_flat([p, p], ["a", "b"]) != [0.0, 0.0] for p in ps]

    first = prompts(0)
    keep = [p for p, ok in zip(first, informative(first)) if ok]
    for round_ in range(1, rounds):
        if len(keep) >= P:
            break
        extra = prompts(7919 * round_)
        keep += [p for p, ok in zip(extra, informative(extra)) if ok]
    before = 1 - sum(informative(first)) / P
    return before, 1 - min(len(keep), P) / P


def test_dynamic_sampling_refills_all_equal_groups(work):
    from omegaconf import OmegaConf

    # half_flat gives zero std to prompts with an even character sum; refills replace their groups
    train(work, "algo=grpo", f"reward.functions=[{USER_REWARD}:half_flat]", "train.max_steps=2", "algo.kl_coef=0",
          "rollout.dynamic_sampling=true", "rollout.max_sampling_rounds=4")
    out = stage_dir(work, RUN, "grpo")
    cfg = OmegaConf.load(out / "config.yaml")
    recs = check_rl_metrics(work, "grpo", 2, kl=False)
    expected = [expected_zero_std(cfg, r, 4) for r in range(2)]
    assert any(before > 0 for before, _ in expected), expected  # the first draw does hold flat groups
    assert [r["frac_zero_std"] for r in recs] == [after for _, after in expected]
    assert all(after < before for before, after in expected if before > 0)


def test_grpo_without_kl_loads_no_reference(work):
    train(work, "algo=grpo", "algo.kl_coef=0", "train.max_steps=2", f"reward.functions=[{ALTERNATE}]",
          "train.lr=1e-3")
    check_rl_metrics(work, "grpo", 2, kl=False)
    check_outputs(work, "grpo", all_changed=False)


def test_static_and_dynamic_kv_caches_train_the_same_policy(work, tmp_path):
    """Hugging Face's fast generation path (static cache) against the plain one (dynamic cache), rows
    in the same order: the same samples, so the same rewards, losses and final weights (to fp32
    rounding)."""
    curves, weights = {}, {}
    for cache in ("static", "dynamic"):
        train(work, "algo=grpo", "train.max_steps=2", f"run.dir=runs/{RUN}/grpo_{cache}", "train.lr=1e-3",
              f"reward.functions=[{USER_REWARD}:answer_length]", f"rollout.hf_cache={cache}",
              "rollout.hf_bucket=false", "rollout.engine=hf")
        out = work / "runs" / RUN / f"grpo_{cache}"
        curves[cache] = [(r["reward"], r["response_len"], r["reward_std"]) for r in rl_records(out)]
        weights[cache] = load_safetensors(out / "final")
    assert curves["static"] == curves["dynamic"]
    assert all(std > 0 for _, _, std in curves["static"])  # varied rewards: a real update each step
    assert not changed_tensors(weights["static"], weights["dynamic"], atol=1e-6)


def test_ligers_fused_loss_trains_the_same_policy_as_rlfts_head(work):
    """train.fused_loss=liger through the CLI: liger-kernel's fused GRPO loss (k3 KL in the loss) against rlft's
    chunked head, same seed: the same rewards and KL each step and the same final weights (to fp32 rounding)."""
    pytest.importorskip("liger_kernel.chunked_loss")
    curves, weights = {}, {}
    for fused in ("rlft", "liger"):
        train(work, "algo=grpo", "train.max_steps=2", f"run.dir=runs/{RUN}/grpo_{fused}", "train.lr=1e-3",
              f"reward.functions=[{USER_REWARD}:answer_length]", f"train.fused_loss={fused}")
        out = work / "runs" / RUN / f"grpo_{fused}"
        curves[fused] = [(r["reward"], r["reward_std"], r["kl"]) for r in rl_records(out)]
        weights[fused] = load_safetensors(out / "final")
    assert [c[:2] for c in curves["liger"]] == [c[:2] for c in curves["rlft"]]
    assert [c[2] for c in curves["liger"]] == pytest.approx([c[2] for c in curves["rlft"]], rel=1e-4, abs=1e-9)
    assert all(std > 0 for _, std, _ in curves["rlft"]) and curves["rlft"][-1][2] > 1e-6  # a real update
    assert changed_tensors(load_safetensors(stage_dir(work, RUN, "sft") / "final"), weights["liger"])
    assert not changed_tensors(weights["rlft"], weights["liger"], atol=1e-6)


# ----------------------------------------------------------------------------- RFT
def test_online_rft(work):
    train(work, "algo=online_rft", "train.max_steps=2", f"reward.functions=[{ALTERNATE}]", "train.lr=1e-3")
    recs = check_rl_metrics(work, "online_rft", 2, kl=False)
    assert all(r[f"reward/{ALTERNATE}"] == 0.5 for r in recs)
    check_outputs(work, "online_rft", all_changed=False)


def test_offline_rft_keeps_samples_of_a_user_reward(work):
    train(work, "algo=rft", f"reward.functions=[{USER_REWARD}:always_one]", "algo.num_prompts=16",
          "rollout.samples_per_prompt=4", "rollout.max_new_tokens=64", "train.max_steps=2", "train.batch_size=8",
          "train.micro_batch_per_device=8", "train.lr=1e-3", "train.log_every=1", rollout=False)
    out = stage_dir(work, RUN, "rft")
    manifest = check_outputs(work, "rft", all_changed=False)
    s = manifest["summary"]
    assert s["rft_sampled"] == 64
    # always_one scores every sample 1.0; only truncated completions (no EOS) are dropped
    assert 1 <= s["rft_correct"] <= 64 and 1 <= s["rft_unique"] <= s["rft_correct"]
    assert 0 < s["rft_prompt_coverage"] <= 1
    losses = [r["loss"] for r in read_metrics(out) if "loss" in r]
    assert len(losses) == 2
    assert_finite(losses)


# ----------------------------------------------------------------------------- config errors
def test_group_of_one_is_rejected(tmp_path):
    line = one_line_error(run_cli(tmp_path, "train", "algo=grpo", "rollout.samples_per_prompt=1", *TINY, timeout=120))
    assert "rollout.samples_per_prompt=1" in line and "at least 2" in line
    assert not (tmp_path / "runs").exists()


def test_unknown_advantage_lists_the_estimators(tmp_path):
    line = one_line_error(run_cli(tmp_path, "train", "algo=grpo", "algo.advantage=nope", *TINY, timeout=120))
    assert "'nope'" in line
    valid = line.split("choose one of:", 1)[1].replace(",", " ").split()
    for name in ("grpo", "dr_grpo", "grpo_process", "rloo", "rft"):
        assert name in valid, line


# Schedules that cannot be honoured are rejected up front with a one-line error.
@pytest.mark.parametrize("args, names", [
    pytest.param(["iterative.iterations=2", "train.max_steps=2", "algo.updates_per_rollout=2"],
                 ["iterative.iterations", "algo.updates_per_rollout"], id="iterations-longer-than-run"),
    pytest.param(["train.max_steps=3", "algo.updates_per_rollout=2"], ["train.max_steps", "algo.updates_per_rollout"],
                 id="max-steps-not-multiple"),
    pytest.param(["algo.kl_in=reward"], ["algo.kl_in=reward", "algo.advantage=grpo", "gae"],
                 id="kl-in-reward-needs-an-estimator-that-reads-it"),
])
def test_inconsistent_rl_schedules_are_config_errors(tmp_path, args, names):
    proc = rl_cli(tmp_path, "train", "algo=grpo", f"run.name={RUN}", *RL_SMALL, *args, timeout=120)
    line = one_line_error(proc)
    for name in names:
        assert name in line, line
