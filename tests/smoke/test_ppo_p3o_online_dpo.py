"""PPO end to end on the tiny model: a critic from the RM, KL in the reward, GAE; the value loss
falls over training, the policy changes, and the critic is exported next to the policy."""
import math

import pytest

from transformers import AutoModelForCausalLM, AutoModelForSequenceClassification

from helpers import (RL_SMALL, USER_REWARD, assert_finite, changed_tensors, check_ok, load_safetensors, make_parents,
                     one_line_error, read_manifest, rl_cli, stage_dir, train_records)


def test_ppo_value_loss_falls_and_policy_moves(tmp_path):
    make_parents(tmp_path, "p", ("sft", "rm"))
    proc = rl_cli(tmp_path, "train", "algo=ppo", "run.name=p", "train.max_steps=16", *RL_SMALL,
                  "rollout.samples_per_prompt=1", "rollout.prompts_per_step=8", "algo.updates_per_rollout=2",
                  "algo.minibatches_per_rollout=2", "train.micro_batch_per_device=4", "critic.lr=1e-3",
                  f"reward.functions=[{USER_REWARD}:alternate]")
    check_ok(proc)
    out = stage_dir(tmp_path, "p", "ppo")
    records = [r for r in train_records(out / "metrics.jsonl", "value_loss")]
    losses = [r["value_loss"] for r in records]
    assert len(losses) == 4 and all(math.isfinite(v) for v in losses), losses
    assert losses[-1] < losses[0], losses  # the critic fits the returns
    assert_finite([r["kl_coef"] for r in records])
    # every phase of the experience and update steps is timed, and they add up to the step
    phases = ("sample", "score", "logprobs", "values", "advantages", "update")
    for r in records:
        assert all(r[f"time/{p}_s"] >= 0 for p in phases) and r["time/values_s"] > 0, r
        assert r["time/step_s"] == pytest.approx(sum(r[f"time/{p}_s"] for p in phases), rel=1e-6)
    assert read_manifest(out)["stage"] == "ppo"
    sft = load_safetensors(stage_dir(tmp_path, "p", "sft") / "final" / "model.safetensors")
    ppo = load_safetensors(out / "final" / "model.safetensors")
    assert changed_tensors(sft, ppo, atol=1e-7)
    AutoModelForCausalLM.from_pretrained(out / "final")
    critic = AutoModelForSequenceClassification.from_pretrained(out / "critic", num_labels=1)
    assert critic.score.weight.shape[0] == 1


def test_ppo_refuses_an_advantage_that_ignores_its_kl_in_the_reward(tmp_path):
    proc = rl_cli(tmp_path, "train", "algo=ppo", "run.name=p", "algo.advantage=grpo", "rollout.samples_per_prompt=2",
                  timeout=120)
    assert "algo.advantage=gae" in one_line_error(proc)


def test_p3o_both_clip_modes_run(tmp_path):
    make_parents(tmp_path, "q", ("sft",))
    sft = load_safetensors(stage_dir(tmp_path, "q", "sft") / "final" / "model.safetensors")
    for mode in ("joint", "separate"):
        proc = rl_cli(tmp_path, "train", "algo=p3o", "run.name=q", f"run.dir=runs/q/p3o_{mode}", "train.max_steps=4",
                      *RL_SMALL, "rollout.samples_per_prompt=2", "rollout.prompts_per_step=4",
                      "train.micro_batch_per_device=4", f"algo.pairwise_loss=p3o_{mode}",
                      f"reward.functions=[{USER_REWARD}:alternate]")
        check_ok(proc)
        out = tmp_path / "runs" / "q" / f"p3o_{mode}"
        records = train_records(out / "metrics.jsonl", "delta_abs")
        assert records and all(r["delta_abs"] > 0.5 for r in records)  # alternate rewards: |delta| ~ 1
        assert_finite([r["is_weight"] for r in records])
        assert changed_tensors(sft, load_safetensors(out / "final" / "model.safetensors"), atol=1e-7)


def test_online_dpo_keeps_untied_pairs(tmp_path):
    make_parents(tmp_path, "o", ("sft",))
    proc = rl_cli(tmp_path, "train", "algo=online_dpo", "run.name=o", "train.max_steps=2", *RL_SMALL,
                  "rollout.samples_per_prompt=2", "rollout.prompts_per_step=4", "train.micro_batch_per_device=4",
                  f"reward.functions=[{USER_REWARD}:alternate]")
    check_ok(proc)
    records = train_records(stage_dir(tmp_path, "o", "online_dpo") / "metrics.jsonl", "dpo_loss")
    assert records[0]["pairs_kept"] == 1.0  # alternate rewards: no ties
    assert abs(records[0]["dpo_loss"] - math.log(2)) < 1e-4  # policy == reference at the first step
    tied = rl_cli(tmp_path, "train", "algo=online_dpo", "run.name=o", "run.dir=runs/o/tied", "train.max_steps=2",
                  *RL_SMALL, "rollout.samples_per_prompt=2", "rollout.prompts_per_step=4", "train.micro_batch_per_device=4",
                  f"reward.functions=[{USER_REWARD}:always_one]")
    check_ok(tied)
    records = train_records(tmp_path / "runs" / "o" / "tied" / "metrics.jsonl", "pairs_kept")
    assert all(r["pairs_kept"] == 0.0 for r in records)  # every pair tied: dropped
