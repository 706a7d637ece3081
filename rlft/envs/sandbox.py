"""Running untrusted Python in a subprocess with limits (env=python; docs/environments.md).

What `run` does for each piece of code:
  * a fresh temporary directory as the working directory and HOME, removed afterwards;
  * a new Python (`-I -B`: no user site, no PYTHONPATH, no bytecode written) with an empty environment;
  * resource limits: CPU seconds (RLIMIT_CPU), address space (RLIMIT_AS), file size (RLIMIT_FSIZE),
    open files (RLIMIT_NOFILE); as root, where this Python can run as the unprivileged user `nobody`,
    it runs as nobody with a process cap (RLIMIT_NPROC, which does not bind root);
  * no network: a network namespace of its own with no interfaces (`unshare -n`, or `unshare -U -r -n`
    where the process may make a user namespace), when this machine allows one;
  * an audit hook (PEP 578) installed before the code runs that refuses, from Python: new processes
    (fork, exec, spawn, subprocess, os.system, and the modules that reach them natively: ctypes,
    _posixsubprocess, multiprocessing), sockets, signals to other processes, and writing, removing or
    renaming files outside the working directory;
  * a wall-clock limit, after which the whole process group is killed, and at most `max_read_bytes`
    of output read (then it is killed too).

What it does not protect against: code that escapes the audit hook through a C extension already
importable in that Python (the hook guards Python-level calls, not native code), reading files that
the user it runs as may read, and a kernel exploit. Run untrusted models' code on a machine or in a
container you would give to a stranger.
"""
from __future__ import annotations

import functools
import os
import resource
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass

NOBODY = 65534

# Installed in the child before the user's code runs (`python -I -B -c GUARD main.py`).
GUARD = r'''
import os, sys
_root = os.path.realpath(os.getcwd())
_BLOCKED = {"os.fork", "os.forkpty", "os.posix_spawn", "os.spawn", "os.exec", "os.system", "subprocess.Popen",
            "os.kill", "os.killpg", "signal.pthread_kill", "socket.__new__", "socket.connect", "socket.bind",
            "socket.getaddrinfo", "ctypes.dlopen", "ctypes.dlsym", "ctypes.cdata", "ctypes.call_function",
            "os.chroot", "os.setuid", "os.setgid", "sys.addaudithook", "pty.spawn"}
_MODULES = {"ctypes", "_ctypes", "_posixsubprocess", "multiprocessing", "_multiprocessing", "pty", "resource"}
_PATHS = {"os.remove", "os.rmdir", "os.rename", "os.mkdir", "os.chmod", "os.chown", "os.symlink", "os.link",
          "os.truncate", "os.utime", "shutil.rmtree", "shutil.move", "shutil.copyfile"}
def _inside(path):
    try:
        p = os.path.realpath(os.fsdecode(path) if not isinstance(path, int) else "/")
    except Exception:
        return False
    return p == _root or p.startswith(_root + os.sep)
def _guard(event, args):
    if event in _BLOCKED:
        raise PermissionError(f"sandbox: {event} is not allowed")
    if event == "import" and args and str(args[0]).split(".")[0] in _MODULES:
        raise PermissionError(f"sandbox: importing {args[0]} is not allowed")
    if event == "open" and len(args) >= 3 and isinstance(args[0], (str, bytes)):
        mode, flags = args[1] or "", args[2] or 0
        writes = any(c in str(mode) for c in "wax+") or flags & (os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC)
        if writes and not _inside(args[0]):
            raise PermissionError(f"sandbox: writing {os.fsdecode(args[0])} (outside the working directory)")
    if event in _PATHS and args and isinstance(args[0], (str, bytes, os.PathLike)):
        for a in args:
            if isinstance(a, (str, bytes, os.PathLike)) and not _inside(a):
                raise PermissionError(f"sandbox: {event} on {os.fsdecode(a)} (outside the working directory)")
sys.addaudithook(_guard)
del _guard
sys.argv = ["main.py"]
import traceback as _tb
try:
    exec(compile(open("main.py").read(), "main.py", "exec"), {"__name__": "__main__", "__builtins__": __builtins__})
except SystemExit:
    raise
except BaseException as _err:  # the user's frames only: what a person running main.py would see
    _frames = [f for f in _tb.extract_tb(_err.__traceback__) if f.filename == "main.py"]
    print("Traceback (most recent call last):", file=sys.stderr)
    print("".join(_tb.format_list(_frames)) + "".join(_tb.format_exception_only(type(_err), _err)), end="",
          file=sys.stderr)
    sys.exit(1)
'''


@dataclass
class Limits:
    timeout_s: float = 5.0
    cpu_s: int = 2
    memory_mb: int = 512
    max_procs: int = 16
    max_file_mb: int = 16
    max_read_bytes: int = 64_000


@dataclass
class Result:
    output: str       # stdout and stderr together, as the code wrote them (up to max_read_bytes)
    exit_code: int | None
    error: str | None  # None: ran to the end and exited 0; else what stopped it (timeout, memory, ...)
    seconds: float


def _limit_child(limits: Limits, drop: bool) -> None:
    """Runs in the child between fork and exec."""
    os.setsid()
    resource.setrlimit(resource.RLIMIT_CPU, (limits.cpu_s, limits.cpu_s + 1))
    memory = limits.memory_mb * 2 ** 20
    resource.setrlimit(resource.RLIMIT_AS, (memory, memory))
    size = limits.max_file_mb * 2 ** 20
    resource.setrlimit(resource.RLIMIT_FSIZE, (size, size))
    resource.setrlimit(resource.RLIMIT_NOFILE, (64, 64))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    if drop:
        resource.setrlimit(resource.RLIMIT_NPROC, (limits.max_procs, limits.max_procs))
        _as_nobody()


@functools.lru_cache(maxsize=2)
def network_isolation(drop: bool) -> tuple[str, ...]:
    """The command prefix that gives the child an empty network namespace here, or () when none works."""
    if not shutil.which("unshare"):
        return ()
    for prefix in (("unshare", "-n"), ("unshare", "-U", "-r", "-n")):
        try:
            probe = subprocess.run(list(prefix) + ["true"], capture_output=True, timeout=10,
                                   preexec_fn=_as_nobody if drop else None)
        except (OSError, subprocess.SubprocessError):
            continue
        if probe.returncode == 0:
            return prefix
    return ()


def _as_nobody() -> None:
    os.setgroups([])
    os.setgid(NOBODY)
    os.setuid(NOBODY)


@functools.lru_cache(maxsize=1)
def drops_privileges() -> bool:
    """As root, whether this Python runs as `nobody` (it cannot where it lives in a folder only root reads,
    e.g. under /root): then the code runs as nobody with a process cap; else as root, without one."""
    if os.geteuid() != 0:
        return False
    try:
        probe = subprocess.run([sys.executable, "-I", "-c", "pass"], capture_output=True, timeout=30, cwd="/",
                               preexec_fn=_as_nobody)
    except (OSError, subprocess.SubprocessError):
        return False
    return probe.returncode == 0


def describe() -> str:
    drop = drops_privileges()
    net = network_isolation(drop)
    return (f"sandbox: {'user nobody, ' if drop else ''}"
            f"{'network namespace (' + ' '.join(net) + ')' if net else 'no network namespace (audit hook only)'}")


def run(code: str, limits: Limits) -> Result:
    """Run `code` as a script in a fresh sandbox; never raises for anything the code does."""
    drop = drops_privileges()
    workdir = tempfile.mkdtemp(prefix="rlft-sandbox-")
    tic = time.time()
    try:
        with open(os.path.join(workdir, "main.py"), "w") as f:
            f.write(code)
        if drop:
            os.chown(workdir, NOBODY, NOBODY)
            os.chown(os.path.join(workdir, "main.py"), NOBODY, NOBODY)
        cmd = list(network_isolation(drop)) + [sys.executable, "-I", "-B", "-c", GUARD]
        env = {"HOME": workdir, "PATH": "/usr/bin:/bin", "LANG": "C.UTF-8", "PYTHONIOENCODING": "utf-8"}
        proc = subprocess.Popen(cmd, cwd=workdir, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, preexec_fn=functools.partial(_limit_child, limits, drop))
        output, why = _read(proc, limits, tic)
        code_ = proc.returncode
        if why is None and code_ is not None and code_ < 0:
            sig = -code_
            why = {signal.SIGXCPU: "cpu time limit", signal.SIGKILL: "killed",
                   signal.SIGSEGV: "crashed (memory)"}.get(sig, f"signal {sig}")
        if why is None and code_ and "MemoryError" in output:
            why = "memory limit"
        elif why is None and code_:
            why = f"exit code {code_}"
        return Result(output=output, exit_code=code_, error=why, seconds=time.time() - tic)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


def _read(proc: subprocess.Popen, limits: Limits, tic: float) -> tuple[str, str | None]:
    """The child's output until it exits, passes the wall-clock limit or writes too much (killed then)."""
    chunks, size, why = [], 0, None
    fd = proc.stdout.fileno()
    while True:
        left = limits.timeout_s - (time.time() - tic)
        if left <= 0:
            why = f"wall-clock limit ({limits.timeout_s:g} s)"
            break
        ready, _, _ = select.select([fd], [], [], min(left, 0.5))
        if ready:
            data = os.read(fd, 65536)
            if not data:
                break
            chunks.append(data)
            size += len(data)
            if size > limits.max_read_bytes:
                why = "output limit"
                break
    if why is not None:
        _kill(proc)
    try:
        proc.wait(timeout=5)
    except subprocess.TimeoutExpired:
        _kill(proc)
        proc.wait()
    proc.stdout.close()
    return b"".join(chunks)[:limits.max_read_bytes].decode("utf-8", "replace"), why


def _kill(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        proc.kill()
