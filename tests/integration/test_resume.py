"""Kill a run hard after its step-8 checkpoint, resume it, and get bit-identical weights.

    rlft train algo=sft run.name=full    train.max_steps=12 train.save_every=4     (uninterrupted)
    rlft train algo=sft run.name=resumed train.max_steps=12 train.save_every=4     (SIGKILL after step 8)
    rlft train algo=sft run.name=resumed ... resume=true                           (finishes steps 9-12)

The tiny model trains a step in milliseconds, too fast to kill at a chosen point, so the run to
be killed goes through a driver that sleeps 0.15 s in each `Trainer.step` call (a pure delay;
nothing computed changes). The resumed run is the plain CLI. The schedule (warm-up, then cosine
at lr=1e-2) makes the optimizer and scheduler state matter: restoring only the weights would
give different final weights.
"""
from __future__ import annotations

import os
import signal
import sys
import time

import pytest
import torch

from helpers import (TINY, check_ok, load_safetensors, popen_cli, read_manifest, run_cli, stage_dir, tmp_leftovers,
                     train_records)

ARGS = ["train", "algo=sft", *TINY, "train.max_steps=12", "train.save_every=4", "train.keep_checkpoints=3",
        "train.batch_size=8", "train.micro_batch_per_device=4", "train.log_every=1", "train.lr=1e-2",
        "train.warmup_steps=2", "train.lr_schedule=cosine", "seed=5"]

SLOW_DRIVER = r"""
import sys, time
import rlft.trainer as trainer_module
_step = trainer_module.Trainer.step
def step(self):
    time.sleep(0.15)
    return _step(self)
trainer_module.Trainer.step = step
from rlft.cli import main
main(sys.argv[1:])
"""


def test_kill_and_resume_reproduces_the_uninterrupted_run(tmp_path):
    # 1. the run that gets killed
    killed = stage_dir(tmp_path, "resumed", "sft")
    target = killed / "checkpoints" / "step-0000008"
    proc = popen_cli(tmp_path, *ARGS, "run.name=resumed", log=tmp_path / "killed.log",
                     prefix=[sys.executable, "-c", SLOW_DRIVER])
    deadline = time.time() + 300
    try:
        while not target.exists():
            assert proc.poll() is None, f"the run ended (exit {proc.returncode}) before step 8:\n" \
                                        f"{(tmp_path / 'killed.log').read_text()[-3000:]}"
            assert time.time() < deadline, "no step-8 checkpoint within 300 s"
            time.sleep(0.01)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=60)
    assert proc.returncode == -signal.SIGKILL
    assert not (killed / "manifest.json").exists(), "the run finished before it was killed"
    assert not (killed / "final").exists()
    assert sorted(p.name for p in (killed / "checkpoints").iterdir()) == ["step-0000004", "step-0000008"]
    logged = [r["step"] for r in train_records(killed)]
    assert logged[:8] == list(range(1, 9)) and len(logged) <= 12

    # 2. the uninterrupted reference
    check_ok(run_cli(tmp_path, *ARGS, "run.name=full"))

    # 3. resume
    out = check_ok(run_cli(tmp_path, *ARGS, "run.name=resumed", "resume=true"))
    assert "at step 8" in out.stdout, out.stdout[-2000:]

    full = stage_dir(tmp_path, "full", "sft")
    expected, got = load_safetensors(full / "final"), load_safetensors(killed / "final")
    assert set(expected) == set(got)
    different = [name for name in expected if not torch.equal(expected[name], got[name])]
    assert not different, f"tensors that differ after resume: {different}"
    assert read_manifest(killed)["completed"] is True

    records = train_records(killed)
    assert [r["step"] for r in records] == list(range(1, 13)), "each step logged exactly once"
    reference = train_records(full)
    assert [r["loss"] for r in records] == pytest.approx([r["loss"] for r in reference], rel=1e-6)
    assert [r["lr"] for r in records] == pytest.approx([r["lr"] for r in reference], rel=1e-12)
    assert len(train_records(killed, key="eval_loss")) == 1

    for run in (killed, full):
        assert not tmp_leftovers(run), tmp_leftovers(run)
        assert all(p.name.startswith("step-") for p in (run / "checkpoints").iterdir())


def test_resume_without_checkpoint_starts_from_scratch(tmp_path):
    out = check_ok(run_cli(tmp_path, "train", "algo=sft", *TINY, "train.max_steps=2", "train.batch_size=8",
                           "train.micro_batch_per_device=8", "train.log_every=1", "run.name=fresh", "resume=true"))
    assert "no checkpoint" in out.stdout
    run = stage_dir(tmp_path, "fresh", "sft")
    assert [r["step"] for r in train_records(run)] == [1, 2]
    assert read_manifest(run)["completed"] is True
