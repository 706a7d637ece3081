"""Running a model's Python under operating-system isolation (env=python; docs/environments.md).

A model under RL is optimised to get reward, and its code will use any way the sandbox leaves to
change what it is judged by. So the boundary is the kernel's, never a check inside the interpreter
that runs the code. Two modes (`env.sandbox`):

* `bwrap` (the default): bubblewrap puts each run in namespaces of its own. The code sees a
  read-only view of the system's /usr (and /bin, /lib, ...) and of the Python that runs it, a few
  harmless /etc files, private tmpfs at /tmp (its working directory and HOME) and /dev/shm, each
  `disk_mb` in size, its own /proc (no other process is visible), a minimal read-only /dev, no
  network (a namespace with only its own loopback: not the host's), and nothing else: not the
  trainer's files, home, data, checkpoints or environment. It runs as uid 65534 with no
  capabilities and no_new_privs, cannot make further user namespaces, and every process it starts
  dies with the run (the PID namespace ends when the code does). Run by root, bubblewrap itself is
  started as `nobody`, so the code is an unprivileged user on the host too and the process cap
  (RLIMIT_NPROC, counted per sandbox in its own user namespace) binds; under any other user it runs
  as that user.
* `trusted`: no isolation. The code runs as the trainer's user, with its files, processes and
  network; only the limits below apply. For code you trust, or a machine that is itself the sandbox.

In both, the code runs in a fresh interpreter (`-I -B -u`: no user site, no PYTHON* variables, no
bytecode written, output unbuffered) with an almost empty environment, under limits set before it
starts and that it cannot raise: CPU seconds, address space, file size, open files, no core files
(and, with bwrap, processes); plus a wall-clock limit and at most `max_read_bytes` of output read,
after which everything is killed.

A seccomp filter (libseccomp, through pyseccomp) refuses the kernel interfaces DENIED_SYSCALLS lists.
What bwrap does not stop is in docs/environments.md ("The sandbox"): the rest of the kernel's
system-call surface, reading what is in the read-only view, and CPU or memory pressure on the host
up to the limits.
"""
from __future__ import annotations

import errno
import functools
import os
import select
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass

from rlft.errors import ConfigError

MODES = ("bwrap", "trusted")
SANDBOX_UID = 65534
"""The uid the code runs as under bwrap (`nobody`), inside the sandbox and, when rlft runs as root, on the host."""
SYSTEM_PATHS = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32")
"""Mounted read-only (or recreated as the symlinks they are, on a merged-/usr system)."""
ETC_FILES = ("/etc/ld.so.cache", "/etc/ld.so.conf", "/etc/ld.so.conf.d", "/etc/localtime", "/etc/alternatives")
"""The only /etc files the code sees (the dynamic loader's cache, the time zone), where they exist."""
WORKDIR = "/tmp"
"""The code's working directory and HOME inside the sandbox: a private tmpfs of `disk_mb`."""
FIND_BWRAP = "install bubblewrap (apt-get install bubblewrap, dnf install bubblewrap, pacman -S bubblewrap)"
TRUSTED_HINT = "or set env.sandbox=trusted to run the model's code without isolation (only for code you trust)"

DENIED_SYSCALLS = ("io_uring_setup", "io_uring_enter", "io_uring_register", "userfaultfd", "bpf", "perf_event_open",
                   "keyctl", "add_key", "request_key", "ptrace", "process_vm_readv", "process_vm_writev", "unshare",
                   "setns", "mount", "umount2", "pivot_root", "chroot", "open_by_handle_at", "name_to_handle_at",
                   "kexec_load", "kexec_file_load", "init_module", "finit_module", "delete_module", "acct", "swapon",
                   "swapoff", "reboot", "syslog")
"""System calls the bwrap sandbox's seccomp filter refuses (EPERM), as container runtimes' default profiles do:
large kernel interfaces that exploits lean on (io_uring, userfaultfd, bpf, perf events, keyrings) and calls a
tool's code has no use for without privileges (tracing, namespaces, mounts, modules). Everything else is allowed;
system calls of another ABI (32-bit on a 64-bit kernel) kill the process."""

# Run in the sandbox's interpreter before the code: the limits (which the code cannot raise again), then
# main.py, with a traceback of the code's own frames only (what a person running main.py would see).
PRELUDE = r'''
import resource, sys
_cpu, _memory, _file, _procs = map(int, sys.argv[1:5])
for _limit, _soft, _hard in ((resource.RLIMIT_CPU, _cpu, _cpu + 1), (resource.RLIMIT_AS, _memory, _memory),
                             (resource.RLIMIT_FSIZE, _file, _file), (resource.RLIMIT_NOFILE, 64, 64),
                             (resource.RLIMIT_CORE, 0, 0), (resource.RLIMIT_NPROC, _procs, _procs)):
    if _hard >= 0:  # -1: not set
        resource.setrlimit(_limit, (_soft, _hard))
del resource, _cpu, _memory, _file, _procs, _limit, _soft, _hard
sys.argv = ["main.py"]
import traceback as _tb
try:
    exec(compile(open("main.py").read(), "main.py", "exec"), {"__name__": "__main__", "__builtins__": __builtins__})
except SystemExit:
    raise
except BaseException as _err:
    _frames = [f for f in _tb.extract_tb(_err.__traceback__) if f.filename == "main.py"]
    print("Traceback (most recent call last):", file=sys.stderr)
    print("".join(_tb.format_list(_frames)) + "".join(_tb.format_exception_only(type(_err), _err)), end="",
          file=sys.stderr)
    sys.exit(1)
'''


@dataclass(frozen=True)
class Limits:
    timeout_s: float = 5.0
    cpu_s: int = 2
    memory_mb: int = 512
    max_procs: int = 8
    """Processes and threads the code may have at once, itself included (bwrap only; each has memory_mb)."""
    max_file_mb: int = 16
    disk_mb: int = 64
    """Size of the private /tmp the code writes in (bwrap only; trusted writes to a host temp folder)."""
    max_read_bytes: int = 64_000


@dataclass
class Result:
    output: str       # stdout and stderr together, as the code wrote them (up to max_read_bytes)
    exit_code: int | None
    error: str | None  # None: ran to the end and exited 0; else what stopped it (timeout, memory, ...)
    seconds: float


class SandboxUnavailable(ConfigError):
    """The isolation env.sandbox asks for cannot be set up here (one line: what is missing, how to get it)."""


@dataclass(frozen=True)
class Isolation:
    """What a mode amounts to on this machine, found once per process (`isolation`)."""
    mode: str
    python: str                 # the interpreter that runs the code (the same path inside the sandbox)
    mounts: tuple[str, ...]     # bwrap's filesystem arguments
    host_uid: int | None        # the uid bwrap is started as (None: the trainer's own)
    version: str = ""
    seccomp: bytes | None = None  # the compiled filter bwrap loads (None: none could be built here)

    def describe(self) -> str:
        if self.mode == "trusted":
            return (f"sandbox: NONE (env.sandbox=trusted): the model's code runs as uid {os.geteuid()} with this "
                    f"machine's files, processes and network; only CPU, memory, file-size, wall-clock and output "
                    f"limits apply; Python {self.python}")
        host = SANDBOX_UID if self.host_uid is not None else os.geteuid()
        read_only = ", ".join(read_only_paths(self.mounts))
        seccomp = (f"seccomp refuses {len(DENIED_SYSCALLS)} system calls (io_uring, bpf, ptrace, ...)" if self.seccomp
                   else f"no seccomp filter ({seccomp_filter()[1]})")
        return (f"sandbox: {self.version}: uid {SANDBOX_UID} (host uid {host}), no capabilities, own pid/mount/ipc/"
                f"uts/user namespaces, no network, read-only {read_only}, private {WORKDIR}, {seccomp}; "
                f"Python {self.python}")


@functools.lru_cache(maxsize=1)
def seccomp_filter() -> tuple[bytes | None, str]:
    """The seccomp filter refusing DENIED_SYSCALLS, compiled by libseccomp for this machine's architecture, or
    (None, why) where libseccomp cannot be loaded (the header then says that no filter is in force)."""
    try:
        import pyseccomp
    except (ImportError, RuntimeError, OSError) as exc:
        return None, f"libseccomp: {exc}"
    rules = pyseccomp.SyscallFilter(pyseccomp.ALLOW)
    for name in DENIED_SYSCALLS:
        try:
            rules.add_rule(pyseccomp.ERRNO(errno.EPERM), name)
        except OSError:  # a system call this architecture does not have
            pass
    with tempfile.TemporaryFile() as f:
        rules.export_bpf(f)
        f.seek(0)
        return f.read(), ""


def check_mode(mode: str) -> str:
    if mode not in MODES:
        raise ConfigError(f"env.sandbox={mode}: expected one of {', '.join(MODES)}")
    return mode


def read_only_paths(mounts: tuple[str, ...]) -> list[str]:
    """The host paths a bwrap argument list mounts read-only (for the header)."""
    return [mounts[i + 1] for i, arg in enumerate(mounts) if arg == "--ro-bind"]


def others_can_run(path: str) -> bool:
    """Whether a user who owns nothing on the way (`nobody`) can reach and run `path`: every folder above it
    searchable by others and the file itself readable and executable by others."""
    path = os.path.realpath(path)
    try:
        mode = os.stat(path).st_mode
        if not (mode & stat.S_IROTH and mode & stat.S_IXOTH):
            return False
        folder = os.path.dirname(path)
        while True:
            if not os.stat(folder).st_mode & stat.S_IXOTH:
                return False
            if folder == "/":
                return True
            folder = os.path.dirname(folder)
    except OSError:
        return False


def python_candidates() -> list[tuple[str, tuple[str, ...]]]:
    """Interpreters the code may run in, with the folders each needs: this Python first (its installation
    and, in a virtual environment, the environment's packages), then the system's."""
    own = (sys.executable,  # not resolved: a virtual environment is found from the path its python is run by
           tuple(dict.fromkeys(os.path.realpath(p) for p in (sys.base_prefix, sys.prefix))))
    system = [(os.path.realpath(p), ("/usr",)) for p in ("/usr/bin/python3", "/usr/local/bin/python3")
              if os.path.exists(p)]
    return [own] + [s for s in system if s[0] != own[0]]


def choose_python(as_nobody: bool) -> tuple[str, tuple[str, ...]]:
    """The first candidate the sandbox's user can run (as root the code runs as nobody, who cannot enter
    e.g. /root); a one-line refusal when none."""
    candidates = python_candidates()
    for python, prefixes in candidates:
        if not as_nobody or (others_can_run(python) and all(others_can_run(p) for p in prefixes)):
            return python, prefixes
    raise SandboxUnavailable(
        f"env.sandbox=bwrap: the sandbox runs the model's code as the unprivileged user nobody, who cannot reach "
        f"any Python here ({', '.join(c[0] for c in candidates)}: a folder on the way is closed to other users); "
        f"install the system's python3 (apt-get install python3), run rlft as a non-root user, {TRUSTED_HINT}")


def bwrap_mounts(prefixes: tuple[str, ...]) -> tuple[str, ...]:
    """bwrap's filesystem arguments: the system's folders and the Python's prefixes read-only, a few /etc
    files, its own /proc and /dev; the private /tmp is added per run (its size is a limit)."""
    args: list[str] = []
    for path in SYSTEM_PATHS:
        if os.path.islink(path):
            args += ["--symlink", os.readlink(path), path]
        elif os.path.isdir(path):
            args += ["--ro-bind", path, path]
    for prefix in prefixes:
        if prefix != "/" and not any(prefix == p or prefix.startswith(p + "/") for p in SYSTEM_PATHS):
            args += ["--ro-bind", prefix, prefix]
    for path in ETC_FILES:
        args += ["--ro-bind-try", path, path]
    return tuple(args + ["--proc", "/proc", "--dev", "/dev"])


BWRAP_OPTIONS = ("--unshare-user", "--unshare-pid", "--unshare-net", "--unshare-ipc", "--unshare-uts",
                 "--unshare-cgroup-try", "--disable-userns", "--die-with-parent", "--new-session",
                 "--uid", str(SANDBOX_UID), "--gid", str(SANDBOX_UID), "--hostname", "sandbox", "--clearenv")


def bwrap_command(iso: Isolation, limits: Limits, code_fd: int, seccomp_fd: int | None) -> list[str]:
    setenv = [a for k, v in code_environment(WORKDIR).items() for a in ("--setenv", k, v)]
    seccomp = ["--seccomp", str(seccomp_fd)] if seccomp_fd is not None else []
    size = ["--size", str(limits.disk_mb * 2 ** 20), "--perms", "1777"]
    return (["bwrap", *BWRAP_OPTIONS, *iso.mounts, *size, "--tmpfs", WORKDIR, *size, "--tmpfs", "/dev/shm",
             "--remount-ro", "/dev", "--remount-ro", "/", "--file", str(code_fd), f"{WORKDIR}/main.py",
             *seccomp, "--chdir", WORKDIR, *setenv]
            + interpreter_command(iso.python, limits, procs=limits.max_procs + 1))  # + 1: bwrap's init


def code_environment(home: str) -> dict[str, str]:
    """All the environment the code gets; numeric libraries on one thread (a thread counts as a process, and
    several runs go at once)."""
    return {"HOME": home, "PATH": "/usr/bin:/bin", "LANG": "C.UTF-8", "PYTHONIOENCODING": "utf-8",
            "OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}


def interpreter_command(python: str, limits: Limits, procs: int) -> list[str]:
    """The interpreter, the prelude and the limits it sets (-1: not set)."""
    values = (limits.cpu_s, limits.memory_mb * 2 ** 20, limits.max_file_mb * 2 ** 20, procs)
    return [python, "-I", "-B", "-u", "-c", PRELUDE, *map(str, values)]  # -u: output in the order it was written


@functools.lru_cache(maxsize=None)
def isolation(mode: str = "bwrap") -> Isolation:
    """The isolation `mode` gives on this machine, checked by running it once; a SandboxUnavailable line
    when it cannot be had (bwrap missing, user namespaces disabled, no Python the sandbox's user can run)."""
    check_mode(mode)
    if mode == "trusted":
        return Isolation("trusted", sys.executable, (), None)
    if not shutil.which("bwrap"):
        raise SandboxUnavailable(f"env.sandbox=bwrap: bubblewrap (bwrap) is not on PATH; {FIND_BWRAP}, {TRUSTED_HINT}")
    as_nobody = os.geteuid() == 0
    python, prefixes = choose_python(as_nobody)
    version = subprocess.run(["bwrap", "--version"], capture_output=True, text=True).stdout.strip() or "bwrap"
    iso = Isolation("bwrap", python, bwrap_mounts(prefixes), SANDBOX_UID if as_nobody else None, version,
                    seccomp_filter()[0])
    probe = run("import os; print(os.getuid())", Limits(timeout_s=30), iso=iso)
    if probe.error or probe.output.strip() != str(SANDBOX_UID):
        said = " ".join(probe.output.split())[:300] or probe.error
        raise SandboxUnavailable(
            f"env.sandbox=bwrap: bubblewrap could not start the sandbox ({said}); it needs unprivileged user "
            f"namespaces (sysctl kernel.unprivileged_userns_clone=1 and user.max_user_namespaces > 0; on Ubuntu "
            f"24.04 and later also kernel.apparmor_restrict_unprivileged_userns=0 or an AppArmor profile for "
            f"bwrap; in a Docker container, whose default seccomp profile refuses them, docker run --security-opt "
            f"seccomp=unconfined), {TRUSTED_HINT}")
    return iso


def describe(mode: str = "bwrap") -> str:
    """The run header's line: which isolation is in force (raises SandboxUnavailable where none can be had)."""
    return isolation(mode).describe()


def run(code: str, limits: Limits, mode: str = "bwrap", iso: Isolation | None = None) -> Result:
    """Run `code` as a script in a fresh sandbox; never raises for anything the code does (SandboxUnavailable
    when the mode's isolation cannot be had here)."""
    iso = iso or isolation(mode)
    tic = time.time()
    if iso.mode == "trusted":
        return _run_trusted(code, limits, iso, tic)
    code_fd = memory_file("main.py", code.encode("utf-8", "surrogateescape"))
    seccomp_fd = memory_file("seccomp", iso.seccomp) if iso.seccomp else None
    fds = tuple(fd for fd in (code_fd, seccomp_fd) if fd is not None)
    try:
        drop = {"user": SANDBOX_UID, "group": SANDBOX_UID, "extra_groups": []} if iso.host_uid is not None else {}
        proc = subprocess.Popen(bwrap_command(iso, limits, code_fd, seccomp_fd), env={}, cwd="/",
                                stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                pass_fds=fds, start_new_session=True, **drop)
    finally:
        for fd in fds:
            os.close(fd)
    return _finish(proc, limits, tic, signal_base=128)  # bwrap exits 128 + N when the code died of signal N


def memory_file(name: str, data: bytes) -> int:
    """A file descriptor of an anonymous in-memory file holding `data`, read from its start (bwrap copies it)."""
    fd = os.memfd_create(name)
    os.write(fd, data)
    os.lseek(fd, 0, os.SEEK_SET)
    return fd


def _run_trusted(code: str, limits: Limits, iso: Isolation, tic: float) -> Result:
    workdir = tempfile.mkdtemp(prefix="rlft-trusted-")
    try:
        with open(os.path.join(workdir, "main.py"), "w") as f:
            f.write(code)
        proc = subprocess.Popen(interpreter_command(iso.python, limits, procs=-1), cwd=workdir,
                                env=code_environment(workdir),
                                stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                start_new_session=True)
        try:
            return _finish(proc, limits, tic, signal_base=None)
        finally:
            _kill(proc)  # what it left running in its process group (a process that left the group lives on)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


SIGNAL_ERRORS = {signal.SIGXCPU: "cpu time limit", signal.SIGKILL: "killed", signal.SIGSEGV: "crashed (memory)",
                 signal.SIGXFSZ: "file size limit"}


def _finish(proc: subprocess.Popen, limits: Limits, tic: float, signal_base: int | None) -> Result:
    output, why = _read(proc, limits, tic)
    code = proc.returncode
    if why is None:
        why = exit_error(code, output, signal_base)
    return Result(output=output, exit_code=code, error=why, seconds=time.time() - tic)


def exit_error(code: int | None, output: str, signal_base: int | None) -> str | None:
    """What an exit status says went wrong (None: exited 0)."""
    if not code:
        return None
    sig = -code if code < 0 else (code - signal_base if signal_base and signal_base < code <= signal_base + 64
                                  else None)
    if sig:
        return SIGNAL_ERRORS.get(sig, f"signal {sig}")
    if "MemoryError" in output:
        return "memory limit"
    return f"exit code {code}"


def _read(proc: subprocess.Popen, limits: Limits, tic: float) -> tuple[str, str | None]:
    """The child's output until it exits, passes the wall-clock limit or writes too much (killed then: with
    bwrap, the sandbox's init dies with bwrap, which ends its PID namespace and every process in it)."""
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
        pass
