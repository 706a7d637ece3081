"""One writer per stage directory, and what that writer may remove.

The driver (node 0's, in a multi-node run) holds `<stage dir>/.lock` for the whole stage:

    {"pid": 1234, "host": "box", "started": "2026-12-01T01:02:03"}

A second run on the same directory stops with a one-line error naming the holder. A lock whose
process is gone (same host, no such pid) is stale: it is taken over, and said so. Holding the lock
means every temporary left in the directory (`.tmp-*`, `.old-*`) belongs to a writer that died, so
they are removed at start.
"""
from __future__ import annotations

import contextlib
import json
import os
import shutil
import socket
import time
from pathlib import Path

from rlft.errors import CompletedStageError, RunDirError, StageLockedError
from rlft.files import handoff

LOCK = ".lock"


def pid_alive(pid: int) -> bool:
    """Whether process `pid` exists and is not a zombie (a killed process nobody has reaped yet)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # exists, owned by someone else
        pass
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return True  # no /proc: trust kill(0)
    return state not in ("Z", "X")


def _holder(lock: Path) -> dict | None:
    try:
        return json.loads(lock.read_text())
    except (OSError, ValueError):
        return None


def make_dir(directory: Path) -> Path:
    """Create `directory` (and its parents); a file system that refuses (read-only, no permission, a file in the
    way) is one line naming the folder and the key that moves it."""
    try:
        Path(directory).mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise RunDirError(f"cannot create {directory}: {exc.strerror or exc}; "
                          "set run.root=<a writable folder>") from None
    return Path(directory)


@contextlib.contextmanager
def stage_lock(stage_dir: Path):
    """Hold `<stage_dir>/.lock` for the duration (StageLockedError when a live run holds it)."""
    stage_dir = make_dir(stage_dir)
    lock = stage_dir / LOCK
    me = {"pid": os.getpid(), "host": socket.gethostname(), "started": time.strftime("%Y-%m-%dT%H:%M:%S")}
    for _ in range(3):
        try:
            fd = os.open(lock, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
        except FileExistsError:
            holder = _holder(lock)
            if holder is None and time.time() - lock.stat().st_mtime < 5:
                time.sleep(1)  # being written right now
                continue
            if holder is None or (holder.get("host") == me["host"] and not pid_alive(int(holder.get("pid", -1)))):
                who = f"pid {holder['pid']}" if holder else "an unreadable lock"
                print(f"[rlft] {stage_dir}: taking over the stale lock of {who} (that run is gone)", flush=True)
                lock.unlink(missing_ok=True)
                continue
            raise StageLockedError(
                f"{stage_dir} is being written by another run (pid {holder.get('pid')} on {holder.get('host')}, "
                f"since {holder.get('started')}); wait for it or use another run.name (if that run is gone, "
                f"delete {lock})") from None
        except OSError as exc:  # a read-only file system, a folder without write permission
            raise RunDirError(f"cannot write in {stage_dir}: {exc.strerror or exc}; "
                              "set run.root=<a writable folder>") from None
        with os.fdopen(fd, "w") as f:
            json.dump(me, f)
        break
    else:
        raise StageLockedError(f"could not take {lock}; delete it if no run is writing {stage_dir}")
    try:
        yield lock
    finally:
        if (_holder(lock) or {}).get("pid") == me["pid"]:
            lock.unlink(missing_ok=True)


def remove_temporaries(stage_dir: Path) -> list[Path]:
    """Remove `.tmp-*` / `.old-*` files and folders below stage_dir (a dead writer's leftovers);
    call only while holding the lock. Returns what was removed."""
    removed = []
    for path in sorted(Path(stage_dir).rglob(".*")):
        if path.name.startswith((".tmp-", ".old-")) and path.exists():
            shutil.rmtree(path, ignore_errors=True) if path.is_dir() else path.unlink(missing_ok=True)
            removed.append(path)
    return removed


def dependents(stage_dir: Path) -> list[Path]:
    """Completed sibling stages of the run whose manifest names this stage's final/ as their parent."""
    final = (Path(stage_dir) / "final").resolve()
    out = []
    for sibling in sorted(Path(stage_dir).parent.iterdir()):
        manifest = handoff.read_manifest(sibling) if sibling.is_dir() and sibling != Path(stage_dir) else None
        if manifest and manifest.get("parent") and Path(str(manifest["parent"])).resolve() == final:
            out.append(sibling)
    return out


def check_not_completed(stage_dir: Path, resume: bool, overwrite: bool) -> None:
    """A completed stage is replaced only with overwrite=true (resume=true continues it instead)."""
    if resume or overwrite or not handoff.read_manifest(stage_dir):
        return
    built = dependents(stage_dir)
    raise CompletedStageError(
        f"{stage_dir} holds a completed stage; rerun with overwrite=true to replace it"
        + (f" (stages built from it: {', '.join(p.name for p in built)})" if built else "")
        + ", or resume=true with a larger train.max_steps to continue it")
