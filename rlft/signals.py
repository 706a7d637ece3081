"""Stopping cleanly on SIGINT / SIGTERM, and no rank outliving its driver.

* `die_with_parent(sig)`: Linux asks the kernel to send `sig` to this process when its parent
  dies, however the parent died (SIGKILL included). The driver's rank launcher gets SIGTERM when
  the driver dies; each rank gets SIGTERM when the launcher dies.
* `install()`: the first SIGINT/SIGTERM only records a stop request; the training loops look at
  it after every optimizer step (`stop_requested`, agreed by all ranks), write a checkpoint and
  stop with a one-line `Interrupted` error naming it. A second signal interrupts at once.
"""
from __future__ import annotations

import ctypes
import os
import signal
import sys

PR_SET_PDEATHSIG = 1
_requested: str | None = None


def die_with_parent(sig: int = signal.SIGTERM) -> None:
    """Have the kernel send `sig` to this process when its parent exits (Linux; a no-op elsewhere)."""
    if not sys.platform.startswith("linux"):
        return
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(PR_SET_PDEATHSIG, int(sig), 0, 0, 0)
    except OSError:
        return
    if os.getppid() == 1:  # the parent was already gone before the request took effect
        os.kill(os.getpid(), sig)


def _handler(signum, frame) -> None:
    global _requested
    if _requested is not None:  # the second signal: stop now
        signal.signal(signum, signal.SIG_DFL)
        raise KeyboardInterrupt
    _requested = signal.Signals(signum).name


def install() -> None:
    """Record SIGINT/SIGTERM as a stop request instead of dying (main thread only)."""
    global _requested
    _requested = None
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, _handler)


def requested() -> str | None:
    """The name of the signal that asked this process to stop, if any."""
    return _requested


def stop_requested() -> str | None:
    """Whether any rank was asked to stop (collective: every rank must call it at the same point)."""
    from rlft import dist

    flag = dist.all_reduce_max([1.0 if _requested else 0.0])[0]
    return (_requested or "a signal to another rank") if flag else None
