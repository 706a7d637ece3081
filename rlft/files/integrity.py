"""Checksums and disk space. What rlft writes can be checked before it is read back: a checksum list in every resumable
checkpoint and every Hugging Face directory rlft exports (final/, iterations/*/).

    write_checksums(dir)   dir/checksums.json: {relative path: {bytes, sha256}} of every file
    damage(dir)            None when every listed file is there with its size and digest, else
                           what is wrong in a few words (the first problem found)

The list is written into the temporary directory before it is renamed into place, so a complete
directory always carries it. Directories without a list (written before checksums existed, or by another tool)
are accepted as unverified (`verified` says False) once their `.safetensors` files' headers read and cover the
file (a file cut short fails there).
"""
from __future__ import annotations

import errno
import hashlib
import json
import os
import shutil
from pathlib import Path

from rlft.errors import DiskFullError

CHECKSUMS = "checksums.json"
_CHUNK = 8 << 20


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(_CHUNK), b""):
            digest.update(block)
    return digest.hexdigest()


def write_text_atomic(path: Path, text: str) -> None:
    """Write `text` to `path` through `.tmp-<name>-<pid>` beside it, renamed into place: a reader sees the old file or
    the whole new one, and a writer that dies leaves only a temporary the next holder of the stage removes. rlft's
    one way of writing a file of a run."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.parent / f".tmp-{path.name}-{os.getpid()}"
    tmp.write_text(text)
    os.replace(tmp, path)


def write_checksums(directory: Path) -> None:
    """Record every file below `directory` (except the list itself) with its size and sha256."""
    directory = Path(directory)
    entries = {}
    for path in sorted(p for p in directory.rglob("*") if p.is_file() and p.name != CHECKSUMS):
        entries[path.relative_to(directory).as_posix()] = {"bytes": path.stat().st_size,
                                                            "sha256": file_sha256(path)}
    write_text_atomic(directory / CHECKSUMS, json.dumps(entries, indent=1, sort_keys=True) + "\n")


def verified(directory: Path) -> bool:
    """Whether `directory` carries a checksum list (it was written by this version of rlft)."""
    return (Path(directory) / CHECKSUMS).is_file()


def damage(directory: Path) -> str | None:
    """None when the directory matches its checksum list (or has none), else the first problem."""
    directory = Path(directory)
    if not directory.is_dir():
        return "the directory is missing"
    listing = directory / CHECKSUMS
    if not listing.is_file():
        return unreadable_safetensors(directory)
    try:
        entries = json.loads(listing.read_text())
    except (OSError, ValueError):
        return f"its {CHECKSUMS} is unreadable"
    for rel, entry in entries.items():
        path = directory / rel
        if not path.is_file():
            return f"{rel} is missing"
        size = path.stat().st_size
        if size != entry["bytes"]:
            return f"{rel} has {size} bytes where {entry['bytes']} were written (truncated or overwritten)"
        if file_sha256(path) != entry["sha256"]:
            return f"{rel} does not match its checksum (its bytes changed after it was written)"
    return None


def unreadable_safetensors(directory: Path) -> str | None:
    """The first `.safetensors` file directly in `directory` whose header does not read or whose tensors do not
    cover the file exactly (safetensors' own check), in a few words; None when all read."""
    from safetensors import safe_open

    for path in sorted(Path(directory).glob("*.safetensors")):
        try:
            with safe_open(str(path), framework="pt"):
                pass
        except Exception as exc:  # noqa: BLE001 - safetensors raises its own error types for every damage
            why = " ".join(str(exc).split())[:120]
            return f"{path.name} cannot be read ({why}; truncated or not a safetensors file)"
    return None


def space_shortage(directory: Path, need_bytes: int, what: str) -> str | None:
    """The one-line reason not to start writing `what` (about need_bytes) under `directory`: its file
    system has less free space than that plus 10%. None when it fits."""
    directory = Path(directory)
    while not directory.exists():
        directory = directory.parent
    free = shutil.disk_usage(directory).free
    if free >= 1.1 * need_bytes:
        return None
    return (f"not enough disk space for {what}: about {need_bytes / 2**20:.1f} MiB needed, {free / 2**20:.1f} MiB "
            f"free at {directory}; free some space and rerun with resume=true (a checkpoint is written beside the "
            f"kept ones before the oldest is removed)")


def raise_if_disk_full(exc: Exception, tmp: Path, what: str) -> None:
    """A write that failed for lack of space (ENOSPC, or torch's 'unexpected pos' when the disk filled
    mid-file): remove the partial copy and raise a one-line DiskFullError."""
    full = getattr(exc, "errno", None) == errno.ENOSPC or "unexpected pos" in str(exc) \
        or "No space left" in str(exc)
    if not full:
        return
    shutil.rmtree(tmp, ignore_errors=True)
    raise DiskFullError(f"the disk filled up while writing {what} (partial copy removed; what was written before "
                        "is intact); free some space and rerun with resume=true") from None
