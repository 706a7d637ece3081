"""Shared pieces of the online-RL tests (unit, integration and smoke).

* `DATA_DIR` (tests/data) goes on sys.path here and on PYTHONPATH for CLI subprocesses, so the
  user reward module is importable as `rl_user_reward:<function>` from any working directory
  (pytest from the repo root, a fresh clone, or a subprocess whose cwd is a tmp dir).
* `RL_SMALL`: a rollout small enough for one CPU core (4 prompts x 4 samples, 24 new tokens).
* `make_parents`: SFT (and RM / PRM) for a few steps, the inputs an RL stage reads.
"""
from __future__ import annotations

import os
import sys
from pathlib import Path

from conftest import REPO, TINY, check_ok, cli_env, run_cli, stage_dir

DATA_DIR = REPO / "tests" / "data"
if str(DATA_DIR) not in sys.path:
    sys.path.insert(0, str(DATA_DIR))

USER_REWARD = "rl_user_reward"

# One rollout = 4 prompts x 4 samples = 16 sequences = one optimizer step (micro 8, 2 accumulation steps).
RL_SMALL = [
    "rollout.prompts_per_step=4", "rollout.samples_per_prompt=4", "rollout.max_new_tokens=24", "algo.eval_problems=8",
    "rollout.batch_size=16", "train.micro_batch_per_device=8", "train.log_every=1", "train.save_every=0",
]
PARENT_STEPS = {"sft": 3, "rm": 2, "prm": 2}
PARENT_ARGS = ["train.batch_size=8", "train.micro_batch_per_device=8", "train.log_every=1", "train.save_every=0"]


def rl_env(**extra: str) -> dict:
    """cli_env with tests/data on PYTHONPATH (user reward functions)."""
    env = cli_env(**extra)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(DATA_DIR), env.get("PYTHONPATH", "")) if p)
    return env


def rl_cli(tmp_path: Path, *args: str, timeout: float = 300):
    """`rlft *args` (tiny model) in tmp_path with the user reward module importable."""
    return run_cli(tmp_path, *args, *TINY, timeout=timeout, env=rl_env())


def make_parents(root: Path, run_name: str, stages=("sft",)) -> dict[str, Path]:
    """Train the given stages (sft first, then rm / prm from it) for a few steps each."""
    out = {}
    for stage in stages:
        check_ok(rl_cli(root, "train", f"algo={stage}", f"run.name={run_name}",
                        f"train.max_steps={PARENT_STEPS[stage]}", *PARENT_ARGS))
        out[stage] = stage_dir(root, run_name, stage)
    return out


def changed_tensors(before: dict, after: dict, atol: float = 0.0) -> list[str]:
    """Names of tensors present in both whose values differ by more than atol."""
    names = sorted(set(before) & set(after))
    return [n for n in names if (before[n].float() - after[n].float()).abs().max().item() > atol]
