"""An RL stage resumed from a checkpoint ends with the same weights as the uninterrupted run, for
the state beyond the policy that the run carries:

* PPO: the critic (its own weights and optimizer, saved in the same checkpoint) and the adaptive
  KL coefficient;
* multi-turn GRPO through an environment (its turns re-sampled exactly after the resume);
* GRPO choosing its prompts by what they teach: the difficulty pool (with dynamic sampling, whose discarded
  groups feed it) and reasoning-gym's curriculum, their state restored with the checkpoint;
* iterative GRPO with a PRM reward: the PRM retrained and the reference reset at the end of
  iteration 0 (reloaded from iterations/iter-0/), resumed inside iteration 1 and exactly at the
  boundary (where the checkpoint's samples of iteration 0 feed the PRM's retraining).

"Interrupted" here means: the finished run's final/, manifest and newer checkpoints are removed,
as a crash after that checkpoint would have left it; then `resume=true` runs the rest.
"""
from __future__ import annotations

import shutil

import pytest

from helpers import (RL_SMALL, changed_tensors, check_ok, load_safetensors, make_parents, read_manifest, read_metrics,
                     rl_cli)

RUN = "rs"
PPO = ["algo=ppo", "rollout.samples_per_prompt=1", "rollout.prompts_per_step=8", "train.micro_batch_per_device=2",
       "rollout.max_new_tokens=16", "algo.eval_every=0", "algo.adaptive_kl=true", "algo.kl_target=0.01",
       "algo.kl_horizon=100", "train.max_steps=8", "train.save_every=4", "train.lr=1e-3", "critic.lr=1e-3",
       "reward.functions=[rl_user_reward:alternate]"]
# multi-turn: every digit the model writes is answered by the environment (tests/data/toy_env.py)
MULTI = ["algo=grpo", *RL_SMALL, "env.name=toy_env:DigitTool", "train.max_steps=4", "train.save_every=2",
         "train.lr=1e-3", "algo.eval_every=0"]
ITER = ["algo=grpo", *RL_SMALL, "iterative.iterations=2", "reward=prm", "train.max_steps=4", "train.save_every=1",
        "train.lr=1e-3", "iterative.rm_steps=2", "algo.eval_every=0"]


# the pool: by_prompt makes a third of the prompts always solved, a third never; 12 rows, so the order repeats
POOL = ["algo=grpo", *RL_SMALL, "data.max_train_rows=12", "rollout.pool.enabled=true", "rollout.pool.revisit_after=3",
        "rollout.dynamic_sampling=true", "reward.functions=[rl_user_reward:by_prompt]", "train.max_steps=8",
        "train.save_every=4", "train.lr=1e-3", "algo.eval_every=0"]
# the curriculum: every completion scores 1, so the level goes up after every second rollout
CURRICULUM = ["algo=grpo", *RL_SMALL, "env=reasoning_gym", "env.task=chain_sum", "env.train_size=30",
              "env.test_size=8", "env.curriculum.enabled=true", "env.curriculum.window=2",
              "env.curriculum.threshold=0.5", "reward.functions=[rl_user_reward:always_one,correctness]",
              "train.max_steps=6", "train.save_every=3", "train.lr=1e-3", "algo.eval_every=0"]


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    root = tmp_path_factory.mktemp("rl_resume")
    make_parents(root, RUN, ("sft", "rm", "prm"))
    return root


def run(root, name, args, *extra):
    check_ok(rl_cli(root, "train", f"run.name={RUN}", f"run.dir=runs/{RUN}/{name}", *args, *extra, timeout=600))
    return root / "runs" / RUN / name


def interrupt_after(stage, step: int) -> None:
    """Leave the stage as a crash right after checkpoint `step` would."""
    (stage / "manifest.json").unlink()
    shutil.rmtree(stage / "final")
    for ckpt in (stage / "checkpoints").glob("step-*"):
        if int(ckpt.name.split("-")[1]) > step:
            shutil.rmtree(ckpt)
    assert (stage / "checkpoints" / f"step-{step:07d}").is_dir()


def test_ppo_resume_restores_the_critic_and_the_adaptive_kl(root):
    full = run(root, "ppo_full", PPO)
    part = run(root, "ppo_part", PPO)
    assert (part / "checkpoints" / "step-0000004" / "critic").is_dir()
    interrupt_after(part, 4)
    run(root, "ppo_part", PPO, "resume=true")
    assert read_manifest(part)["completed"] is True
    a, b = load_safetensors(full / "final"), load_safetensors(part / "final")
    assert not changed_tensors(a, b, atol=1e-6), changed_tensors(a, b, atol=1e-6)[:5]
    ca, cb = load_safetensors(full / "critic"), load_safetensors(part / "critic")
    assert not changed_tensors(ca, cb, atol=1e-6)
    assert read_manifest(full)["summary"]["kl_coef"] == pytest.approx(read_manifest(part)["summary"]["kl_coef"])
    assert read_manifest(full)["summary"]["kl_coef"] != 0.05  # the controller did move it


@pytest.mark.parametrize("resume_at", [3, 2])  # inside iteration 1, and at the iteration boundary
def test_iterative_resume_restores_the_retrained_prm_and_the_reference(root, resume_at):
    full = root / "runs" / RUN / "iter_full"
    if not full.exists():
        run(root, "iter_full", ITER)
    part = run(root, f"iter_part{resume_at}", ITER)
    interrupt_after(part, resume_at)
    if resume_at == 2:  # the boundary: iteration 0's retraining happens after the resume
        shutil.rmtree(part / "iterations")
    run(root, f"iter_part{resume_at}", ITER, "resume=true")
    a, b = load_safetensors(full / "final"), load_safetensors(part / "final")
    assert not changed_tensors(a, b, atol=1e-6), changed_tensors(a, b, atol=1e-6)[:5]
    pa = load_safetensors(full / "iterations" / "iter-0" / "prm")
    pb = load_safetensors(part / "iterations" / "iter-0" / "prm")
    assert not changed_tensors(pa, pb, atol=1e-6)


def test_a_multi_turn_run_resumes_to_the_uninterrupted_runs_weights(root):
    full = run(root, "mt_full", MULTI)
    part = run(root, "mt_part", MULTI)
    interrupt_after(part, 2)
    run(root, "mt_part", MULTI, "resume=true")
    a, b = load_safetensors(full / "final"), load_safetensors(part / "final")
    assert not changed_tensors(a, b, atol=1e-6), changed_tensors(a, b, atol=1e-6)[:5]
    from helpers import read_metrics

    recs = [r for r in read_metrics(full) if "turns" in r]
    assert recs and all(r["turns"] > 1 for r in recs)  # the trajectories were multi-turn


def test_the_difficulty_pool_retires_prompts_and_resumes_to_the_same_weights(root):
    full = run(root, "pool_full", POOL)
    records = [r for r in read_metrics(full) if "pool/seen" in r]
    last = records[-1]
    assert last["pool/seen"] == 12 and last["pool/retired_solved"] > 0 and last["pool/retired_unsolved"] > 0
    assert sum(r["pool/skipped"] for r in records) > 0 and sum(r["pool/revisited"] for r in records) > 0
    part = run(root, "pool_part", POOL)
    interrupt_after(part, 4)
    run(root, "pool_part", POOL, "resume=true")
    a, b = load_safetensors(full / "final"), load_safetensors(part / "final")
    assert not changed_tensors(a, b, atol=0), changed_tensors(a, b, atol=0)[:5]
    resumed = [r for r in read_metrics(part) if "pool/seen" in r][-1]
    assert {k: v for k, v in resumed.items() if k.startswith("pool/")} == {k: v for k, v in last.items()
                                                                          if k.startswith("pool/")}


def test_the_curriculum_raises_the_level_and_resumes_to_the_same_weights(root):
    full = run(root, "cur_full", CURRICULUM)
    levels = [r["curriculum/level"] for r in read_metrics(full) if "curriculum/level" in r]
    assert levels == [0, 0, 1, 1, 2, 2]  # two rollouts at each level, each at mean reward >= 0.5
    part = run(root, "cur_part", CURRICULUM)
    interrupt_after(part, 3)
    run(root, "cur_part", CURRICULUM, "resume=true")
    a, b = load_safetensors(full / "final"), load_safetensors(part / "final")
    assert not changed_tensors(a, b, atol=0), changed_tensors(a, b, atol=0)[:5]
