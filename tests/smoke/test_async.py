"""Asynchronous RL (rollout.max_staleness=K): rollout j is sampled in a sampler process from the weights
after j - K updates, never more than K behind; a resumed run trains the same samples and ends with the
uninterrupted run's weights; LoRA and two ranks under ZeRO-3 sync their (merged, gathered) weights."""
from __future__ import annotations

import torch

from helpers import RL_SMALL, USER_REWARD, check_ok, load_safetensors, make_parents, read_metrics, rl_cli, stage_dir

RUN = "as"
ASYNC = [*RL_SMALL, f"reward.functions=[correctness,{USER_REWARD}:alternate]", "train.lr=1e-2",
         "train.warmup_steps=0", "algo.eval_every=0"]


def rollouts(run_dir) -> list[dict]:
    return [r for r in read_metrics(run_dir) if "staleness_mean" in r]


def test_async_grpo_keeps_its_staleness_bound_and_resumes_exactly(tmp_path):
    make_parents(tmp_path, RUN, ("sft",))
    args = ["train", "algo=grpo", f"run.name={RUN}", *ASYNC, "rollout.max_staleness=2", "train.save_every=2"]
    check_ok(rl_cli(tmp_path, *args, "train.max_steps=5", "run.dir=runs/as/full"))
    full = tmp_path / "runs" / "as" / "full"
    records = rollouts(full)
    # rollout j from version max(0, j - 2): staleness 0, 1, then 2 for good
    assert [r["staleness_mean"] for r in records] == [0, 1, 2, 2, 2]
    assert max(r["staleness_max"] for r in records) == 2
    assert records[0]["engine_logp_gap_max"] < 1e-5  # the sampler held exactly the trainer's weights
    assert records[-1]["engine_logp_gap_mean"] > 1e-4 and records[-1]["is_weight_mean"] != 1.0  # the lag, corrected
    assert all(r["time/sampler_busy_s"] > 0 for r in records)
    # stopped after 3 rollouts (checkpoint at 2 with rollouts 2 and 3 in flight), resumed to 5
    check_ok(rl_cli(tmp_path, *args, "train.max_steps=3", "run.dir=runs/as/parts"))
    out = check_ok(rl_cli(tmp_path, *args, "train.max_steps=5", "run.dir=runs/as/parts", "resume=true")).stdout
    assert "resumed from" in out and "step-0000002" in out, out[-2000:]
    a, b = load_safetensors(full / "final"), load_safetensors(tmp_path / "runs" / "as" / "parts" / "final")
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_async_with_lora_on_two_ranks_under_zero3(tmp_path):
    make_parents(tmp_path, RUN, ("sft",))
    check_ok(rl_cli(tmp_path, "train", "algo=grpo", f"run.name={RUN}", *ASYNC, "rollout.max_staleness=1",
                    "train.max_steps=3", "model.lora.rank=4", "deepspeed=zero3", "deepspeed.nproc_per_node=2",
                    "train.save_every=0", timeout=600))
    records = rollouts(stage_dir(tmp_path, RUN, "grpo"))
    assert [r["staleness_mean"] for r in records] == [0, 1, 1]
    # every sync's fingerprint matched (else the run stops); at staleness 0 the samplers' log-probs are the
    # trainer's: the merged adapter, gathered from both ranks' shards, reached both sampler processes
    assert records[0]["engine_logp_gap_max"] < 1e-5 < records[-1]["engine_logp_gap_mean"]


def test_async_ppo_samples_multi_turn_trajectories_in_the_sampler(tmp_path):
    """The sampler process runs the environment's episodes (a user environment whose trajectories call its
    tool), and PPO's critic trains on them as on on-policy ones."""
    env = ["env.name=toy_env:DigitTool", "data.use_chat_template=false"]
    check_ok(rl_cli(tmp_path, "train", "algo=sft", f"run.name={RUN}", "train.max_steps=3", "train.batch_size=8",
                    "train.micro_batch_per_device=8", "train.save_every=0", *env))
    make_parents(tmp_path, RUN, ("rm",))
    check_ok(rl_cli(tmp_path, "train", "algo=ppo", f"run.name={RUN}", *RL_SMALL, "rollout.max_staleness=1",
                    "train.max_steps=8", "algo.eval_every=0", *env))  # 2 rollouts of 4 optimizer steps
    records = rollouts(stage_dir(tmp_path, RUN, "ppo"))
    assert [r["staleness_mean"] for r in records] == [0, 1]
    assert all(r["turns"] > 1 and r["tool_calls"] > 0 for r in records), records
    assert all(0 < r["response_len"] < 24 for r in records)  # the model's tokens only: the tool's are masked


def test_async_with_the_difficulty_pool_resumes_exactly(tmp_path):
    """Rollouts r+1..r+K are chosen while r trains, from the pool as it stood; the checkpoint keeps the pool
    and the rollouts in flight, so a resumed run samples and trains the same prompts."""
    make_parents(tmp_path, RUN, ("sft",))
    args = ["train", "algo=grpo", f"run.name={RUN}", *ASYNC, "reward.functions=[rl_user_reward:by_prompt]",
            "data.max_train_rows=12", "rollout.pool.enabled=true", "rollout.pool.revisit_after=2",
            "rollout.max_staleness=2", "train.save_every=3"]
    check_ok(rl_cli(tmp_path, *args, "train.max_steps=7", "run.dir=runs/as/pool_full"))
    full = tmp_path / "runs" / "as" / "pool_full"
    assert [r["staleness_mean"] for r in rollouts(full)] == [0, 1, 2, 2, 2, 2, 2]
    assert rollouts(full)[-1]["pool/retired_solved"] > 0
    check_ok(rl_cli(tmp_path, *args, "train.max_steps=4", "run.dir=runs/as/pool_parts"))
    check_ok(rl_cli(tmp_path, *args, "train.max_steps=7", "run.dir=runs/as/pool_parts", "resume=true"))
    a, b = load_safetensors(full / "final"), load_safetensors(tmp_path / "runs" / "as" / "pool_parts" / "final")
    assert all(torch.equal(a[k], b[k]) for k in a)
