"""Faults injected as a user (or the machine) would cause them: damaged checkpoints and outputs,
non-finite training, two runs on one stage, a rerun of a completed stage. Each ends in a one-line
error or a stated recovery, never in a complete manifest over bad weights."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import time

import pytest
from helpers import (SMALL_BATCH, TINY, check_ok, load_safetensors, one_line_error, popen_cli, read_manifest, run_cli,
                     require, stage_dir)

from rlft.files.integrity import damage

# a constant schedule, so a run extended on resume matches one trained to the longer length at once
SFT = ["algo=sft", *TINY, *SMALL_BATCH, "train.lr_schedule=constant", "train.warmup_steps=0"]


def sft(tmp_path, *args, name="f"):
    return run_cli(tmp_path, "train", *SFT, f"run.name={name}", *args, timeout=300)


def weights(tmp_path, name="f"):
    return load_safetensors(stage_dir(tmp_path, name, "sft") / "final")


def damage_file(path, how: str) -> None:
    if how == "bytes":  # 64 random bytes in the middle of the file
        data = bytearray(path.read_bytes())
        mid = len(data) // 2
        data[mid:mid + 64] = os.urandom(64)
        path.write_bytes(bytes(data))
    elif how == "truncate":
        path.write_bytes(path.read_bytes()[: path.stat().st_size // 3])
    else:
        path.unlink()


def largest_file(directory):
    return max((p for p in directory.rglob("*") if p.is_file()), key=lambda p: p.stat().st_size)


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """An uninterrupted 6-step SFT run: the weights every recovered resume must end with."""
    root = tmp_path_factory.mktemp("ref")
    check_ok(sft(root, "train.max_steps=6", "train.save_every=2", "train.keep_checkpoints=3"))
    return weights(root)


@pytest.mark.parametrize("how", ["bytes", "truncate", "delete"])
def test_a_damaged_latest_checkpoint_falls_back_to_the_previous_one(tmp_path, reference, how):
    check_ok(sft(tmp_path, "train.max_steps=4", "train.save_every=2", "train.keep_checkpoints=3"))
    ckpts = stage_dir(tmp_path, "f", "sft") / "checkpoints"
    assert sorted(p.name for p in ckpts.iterdir()) == ["step-0000002"]  # the last step writes final/ instead
    # a later step's checkpoint exists only in an interrupted run: make one by copying and damaging
    shutil.copytree(ckpts / "step-0000002", ckpts / "step-0000003")
    damage_file(largest_file(ckpts / "step-0000003"), how)
    proc = check_ok(sft(tmp_path, "train.max_steps=6", "train.save_every=2", "train.keep_checkpoints=3",
                        "resume=true"))
    out = proc.stdout + proc.stderr
    assert "skipping damaged checkpoint" in out and "step-0000003" in out, out[-2000:]
    assert "resumed from" in out and "step-0000002" in out
    got = weights(tmp_path)
    assert all((got[k] == reference[k]).all() for k in reference)


def test_no_intact_checkpoint_is_one_line(tmp_path):
    check_ok(sft(tmp_path, "train.max_steps=4", "train.save_every=2"))
    ckpt = stage_dir(tmp_path, "f", "sft") / "checkpoints" / "step-0000002"
    damage_file(largest_file(ckpt), "bytes")
    line = one_line_error(sft(tmp_path, "train.max_steps=6", "train.save_every=2", "resume=true"))
    assert "no intact checkpoint" in line and "step-0000002" in line and "checksum" in line, line


def test_a_damaged_input_model_is_named(tmp_path):
    check_ok(sft(tmp_path, "train.max_steps=2"))
    damage_file(stage_dir(tmp_path, "f", "sft") / "final" / "model.safetensors", "bytes")
    line = one_line_error(run_cli(tmp_path, "train", "algo=rm", "run.name=f", *TINY, *SMALL_BATCH,
                                  "train.max_steps=1", timeout=120))
    assert "damaged" in line and "model.safetensors" in line and "overwrite=true" in line, line
    assert not stage_dir(tmp_path, "f", "rm").exists()


@pytest.mark.parametrize("policy", ["stop", "drop"])
def test_a_non_finite_loss_stops_without_saving(tmp_path, policy):
    proc = sft(tmp_path, "train.lr=1e6", "train.max_steps=20", "train.save_every=1", f"train.on_nonfinite={policy}")
    line = one_line_error(proc)
    assert "non-finite" in line and "optimizer step" in line, line
    out = stage_dir(tmp_path, "f", "sft")
    assert not (out / "final").exists() and not (out / "manifest.json").exists()
    for ckpt in (out / "checkpoints").iterdir() if (out / "checkpoints").exists() else []:
        state = load_state(ckpt)
        assert all(bool(v.isfinite().all()) for v in state.values()), ckpt


def load_state(ckpt):
    import torch

    state = torch.load(ckpt / "state" / "mp_rank_00_model_states.pt", map_location="cpu", weights_only=False)
    return {k: v for k, v in state["module"].items() if v.is_floating_point()}


def test_a_second_run_on_a_live_stage_is_refused(tmp_path):
    # long enough never to finish while the test runs (it is killed below)
    first = popen_cli(tmp_path, "train", *SFT, "run.name=f", "train.max_steps=1000000", "train.log_every=1000",
                      "train.save_every=0", log=tmp_path / "first.log")
    lock = stage_dir(tmp_path, "f", "sft") / ".lock"
    try:
        deadline = time.time() + 60
        while not lock.exists() and time.time() < deadline:
            time.sleep(0.2)
        assert lock.exists(), (tmp_path / "first.log").read_text()
        line = one_line_error(sft(tmp_path, "train.max_steps=2"))
        assert "being written by another run" in line and f"pid {first.pid}" in line, line
        assert first.poll() is None, "the first run ended before it was killed"
    finally:
        first.kill()
        first.wait()
    # the holder is gone: its lock is stale and taken over, its temporaries removed
    leftover = stage_dir(tmp_path, "f", "sft") / "checkpoints" / ".tmp-step-0000009"
    leftover.mkdir(parents=True)
    proc = check_ok(sft(tmp_path, "train.max_steps=2"))
    assert "stale lock" in proc.stdout and "removed" in proc.stdout, proc.stdout[-2000:]
    assert not leftover.exists() and not lock.exists()


def test_a_lock_held_elsewhere_names_its_host(tmp_path):
    out = stage_dir(tmp_path, "f", "sft")
    out.mkdir(parents=True)
    (out / ".lock").write_text(json.dumps({"pid": 1, "host": "other-box", "started": "2026-01-01T00:00:00"}))
    line = one_line_error(sft(tmp_path, "train.max_steps=2"))
    assert "other-box" in line and ".lock" in line, line


def test_a_completed_stage_is_replaced_only_with_overwrite(tmp_path):
    check_ok(sft(tmp_path, "train.max_steps=2"))
    check_ok(run_cli(tmp_path, "train", "algo=rm", "run.name=f", *TINY, *SMALL_BATCH, "train.max_steps=1",
                     timeout=120))
    before = weights(tmp_path)
    line = one_line_error(sft(tmp_path, "train.max_steps=3", "seed=1"))
    assert "completed stage" in line and "overwrite=true" in line and "rm" in line, line
    assert all((weights(tmp_path)[k] == before[k]).all() for k in before)  # untouched
    check_ok(sft(tmp_path, "train.max_steps=3", "seed=1", "overwrite=true"))
    assert read_manifest(stage_dir(tmp_path, "f", "sft"))["summary"]
    assert any(not (weights(tmp_path)[k] == before[k]).all() for k in before)


@pytest.fixture
def small_disk(tmp_path):
    """A 400 KiB file system (tmpfs; needs the right to mount: skipped without it, except in CI, where it
    fails, so CI cannot pass without having run it): room for one checkpoint of the tiny model (~200 KB)
    but not two."""
    mount = tmp_path / "disk"
    mount.mkdir()
    made = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=400k", "tmpfs", str(mount)], capture_output=True)
    require(f"cannot mount a small file system here: {made.stderr.decode().strip()}" if made.returncode else None)
    yield mount
    subprocess.run(["umount", str(mount)], check=False)


def test_a_full_disk_stops_with_one_line_and_keeps_the_last_checkpoint(tmp_path, small_disk):
    line = one_line_error(sft(tmp_path, f"run.root={small_disk}", "train.max_steps=20", "train.save_every=5"))
    assert "not enough disk space for checkpoint step-0000010" in line and "resume=true" in line, line
    ckpts = small_disk / "f" / "sft" / "checkpoints"
    assert [p.name for p in ckpts.iterdir()] == ["step-0000005"]  # intact, nothing half-written beside it
    assert damage(ckpts / "step-0000005") is None


def test_a_write_that_runs_out_of_space_is_named_and_cleaned(tmp_path):
    import errno

    from rlft.errors import DiskFullError
    from rlft.files.integrity import raise_if_disk_full

    for exc in (OSError(errno.ENOSPC, "No space left on device"),
                RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos 1234 vs 1200")):
        partial = tmp_path / ".tmp-step-0000004"
        partial.mkdir()
        with pytest.raises(DiskFullError, match="disk filled up while writing checkpoint"):
            raise_if_disk_full(exc, partial, "checkpoint")
        assert not partial.exists()
    raise_if_disk_full(RuntimeError("something else"), tmp_path, "checkpoint")  # not a disk error: left alone


def descendants(pid: int) -> list[int]:
    from rlft.launch import children

    out = []
    for child in children(pid):
        out += [child, *descendants(child)]
    return out


def alive(pid: int) -> bool:
    try:
        state = [line for line in open(f"/proc/{pid}/status") if line.startswith("State:")][0]
    except (OSError, IndexError):
        return False
    return "Z" not in state.split()[1]


def start_two_ranks(tmp_path, name):
    """A 2-rank SFT long enough to be interrupted; returns (driver, its rank processes) once training runs."""
    driver = popen_cli(tmp_path, "train", *SFT, f"run.name={name}", "deepspeed.nproc_per_node=2",
                       "train.max_steps=5000",
                       "train.log_every=100", "train.save_every=0", log=tmp_path / f"{name}.log")
    deadline = time.time() + 120
    while time.time() < deadline:
        log = (tmp_path / f"{name}.log").read_text()
        if "step 100/5000" in log:
            break
        assert driver.poll() is None, log
        time.sleep(0.5)
    ranks = descendants(driver.pid)
    assert len(ranks) >= 3, ranks  # the launcher and two ranks
    return driver, ranks


def test_killing_the_driver_leaves_no_rank_running(tmp_path):
    driver, ranks = start_two_ranks(tmp_path, "k")
    os.kill(driver.pid, 9)
    driver.wait()
    deadline = time.time() + 30
    while any(alive(p) for p in ranks) and time.time() < deadline:
        time.sleep(0.5)
    assert not [p for p in ranks if alive(p)], "rank processes outlived the driver"


def test_sigterm_checkpoints_and_says_how_to_resume(tmp_path):
    import signal

    driver, ranks = start_two_ranks(tmp_path, "t")
    driver.send_signal(signal.SIGTERM)
    assert driver.wait(timeout=120) != 0
    log = (tmp_path / "t.log").read_text()
    lines = [line for line in log.splitlines() if line.startswith("rlft: error:")]
    assert lines and "stopped by SIGTERM after step" in lines[-1] and "resume=true" in lines[-1], log[-3000:]
    assert "Traceback" not in log, log[-3000:]
    ckpts = list((stage_dir(tmp_path, "t", "sft") / "checkpoints").iterdir())
    assert len(ckpts) == 1 and damage(ckpts[0]) is None
    assert not [p for p in ranks if alive(p)]
