"""Folders rlft derives once from a model the user names and reuses in later runs: a GGUF file's plain
folder (rlft/gguf.py) and an adapter folder merged onto its base (rlft/lora.py). They live under
`$RLFT_CACHE` (default `~/.cache/rlft`)/models/<name>-<hash>/, written through a temporary folder
that is renamed into place, so a folder that exists is complete."""
from __future__ import annotations

import functools
import hashlib
import os
import shutil
from pathlib import Path


def cache_root() -> Path:
    return Path(os.environ.get("RLFT_CACHE") or Path.home() / ".cache" / "rlft").expanduser()


def model_folder(name: str) -> Path:
    return cache_root() / "models" / name


def temporary_for(out: Path) -> Path:
    """An empty temporary sibling of `out`, this process's own."""
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.parent / f".tmp-{out.name}-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    return tmp


def publish(tmp: Path, out: Path) -> None:
    """Rename the written `tmp` to `out`; if another process published `out` first, keep theirs."""
    try:
        os.rename(tmp, out)
    except OSError:
        shutil.rmtree(tmp, ignore_errors=True)
        if not (out / "config.json").is_file():
            raise


def file_hash(file: Path) -> str:
    """The first 16 hex digits of the file's sha256, read once per version of the file in a process (every
    stage and rank resolves model.path several times)."""
    stat = file.stat()
    return _hash(str(file.resolve()), stat.st_size, stat.st_mtime_ns)


@functools.lru_cache(maxsize=8)
def _hash(path: str, size: int, mtime_ns: int) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(1 << 24):
            h.update(block)
    return h.hexdigest()[:16]


def text_hash(text: str) -> str:
    """The first 8 hex digits of the text's sha256 (a base model's path in a cached folder's name)."""
    return hashlib.sha256(text.encode()).hexdigest()[:8]
