"""The python tool's sandbox against hostile code (rlft/envs/sandbox.py, docs/environments.md "The sandbox").

Each case is code a policy under RL might write to change what it is judged by or to reach the trainer. It
runs in the default sandbox (bubblewrap); the host then checks, from outside, that nothing escaped: the
trainer's secrets are not in the output, no file outside the sandbox was written or changed, a neighbouring
process (of the same host uid as the sandbox where rlft runs as root) is alive, a loopback server got no
connection, and nothing the code started is still running. The case's own failure comes back as the step's
tool error. Where bubblewrap cannot run the tests skip, except in CI (CI=true), where a skip fails: `make
test` installs bubblewrap.
"""
from __future__ import annotations

import glob
import hashlib
import os
import socket
import subprocess
import tempfile
import time
import uuid

import pytest

from helpers import require, sandbox_missing
from rlft.envs import sandbox

SECRET = f"rlft-secret-{uuid.uuid4().hex}"


@pytest.fixture(scope="module")
def host():
    """What the code aims at: the trainer's secrets (environment, a file others may read), a neighbour process
    holding the secret, loopback servers (TCP and an abstract unix socket), and files it must not change."""
    require(sandbox_missing())
    saved = {k: os.environ.get(k) for k in ("WANDB_API_KEY", "HF_TOKEN")}
    os.environ.update(WANDB_API_KEY=SECRET, HF_TOKEN=SECRET)
    outside = tempfile.mkdtemp(prefix="rlft-outside-")
    os.chmod(outside, 0o755)  # readable by every user: only the sandbox's mount namespace hides it
    secret_file = os.path.join(outside, "secret.txt")
    with open(secret_file, "w") as f:
        f.write(SECRET)
    os.chmod(secret_file, 0o644)
    as_sandbox_user = {"user": sandbox.SANDBOX_UID} if os.geteuid() == 0 else {}
    neighbour = subprocess.Popen(["sleep", "600"], env={"RLFT_TEST_SECRET": SECRET}, **as_sandbox_user)
    tcp = socket.socket()
    tcp.bind(("127.0.0.1", 0))
    tcp.listen()
    tcp.setblocking(False)
    abstract_name = f"rlft-sandbox-test-{os.getpid()}"
    unix = socket.socket(socket.AF_UNIX)
    unix.bind("\0" + abstract_name)
    unix.listen()
    unix.setblocking(False)
    import rlft.envs.math as verifier

    facts = {"outside": outside, "secret_file": secret_file, "host_pid": os.getpid(), "host_pgid": os.getpgid(0),
             "neighbour_pid": neighbour.pid, "port": tcp.getsockname()[1], "abstract": abstract_name,
             "verifier": os.path.realpath(verifier.__file__), "stdlib": os.path.realpath(os.__file__)}
    yield facts, neighbour, tcp, unix
    neighbour.kill()
    neighbour.wait()
    tcp.close()
    unix.close()
    for key, value in saved.items():
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value
    for path in glob.glob(os.path.join(outside, "*")):
        os.remove(path)
    os.rmdir(outside)


# name: (code, the error the step reports (a prefix; None: the code ends normally), text its output shows (or one
# of several: the kernel may refuse a write for either reason, depending on who owns the file on the host))
HOSTILE = {
    "running as root": ("""
import os
caps = dict(line.split(':\\t') for line in open('/proc/self/status').read().splitlines() if line.startswith('Cap'))
print('uid', os.getuid(), os.geteuid(), 'CapEff', caps['CapEff'], 'CapPrm', caps['CapPrm'])
if os.geteuid() == 0 or int(caps['CapEff'], 16) or int(caps['CapPrm'], 16):
    print('ESCAPED')
os.setuid(0)
""", "exit code 1", "uid 65534 65534 CapEff 0000000000000000 CapPrm 0000000000000000"),
    "the old guard's tables cleared, then a subprocess": ("""
import subprocess, sys
for name in ('_BLOCKED', '_MODULES', '_PATHS'):
    getattr(sys.modules['__main__'], name, set()).clear()
uid = subprocess.run(['id', '-u'], capture_output=True, text=True).stdout.strip()
print('subprocess uid', uid)
if uid == '0':
    print('ESCAPED')
open('{outside}/from-guard', 'w').write('x')
""", "exit code 1", "subprocess uid 65534"),
    "os.path monkeypatched, then writing outside": ("""
import os, os.path
os.path.realpath = os.path.abspath = lambda path, *a, **k: '/tmp/' + os.path.basename(path)
open('{outside}/from-realpath', 'w').write('x')
""", "exit code 1", "FileNotFoundError"),
    "rewriting rlft's verifier or the standard library": ("""
import os
for path in ('{verifier}', '{stdlib}', os.__file__):
    try:
        open(path, 'a').write('# changed')
        print('ESCAPED', path)
    except OSError as err:
        print(path, type(err).__name__)
open(os.__file__, 'a')
""", "exit code 1", ("Read-only file system", "Permission denied")),
    "writing the host's /tmp": ("""
open('/tmp/rlft-sandbox-escape', 'w').write('x')
import os
os.makedirs('/rlft-sandbox-escape')
""", "exit code 1", "Read-only file system"),
    "the trainer's environment (/proc/<ppid>/environ)": ("""
import glob, os
print('environ', dict(os.environ))
for path in glob.glob('/proc/*/environ'):
    try:
        print(path, open(path, 'rb').read())
    except OSError as err:
        print(path, type(err).__name__)
print('parent', os.getppid())
print(open('/proc/{host_pid}/environ', 'rb').read())
""", "exit code 1", "FileNotFoundError"),
    "the trainer's files, home and /etc": ("""
import os
print(sorted(os.listdir('/')), sorted(os.listdir('/etc')))
for path in ('/root', '/home', '/work', '/etc/shadow', '/etc/passwd', '/proc/1/root/etc/shadow'):
    print(path, os.path.exists(path))
print(open('{secret_file}').read())
""", "exit code 1", "FileNotFoundError"),
    "another process's memory and files": ("""
for what in ('environ', 'cmdline', 'maps', 'root/etc/hostname'):
    try:
        print(what, open('/proc/{neighbour_pid}/' + what, 'rb').read(200))
    except OSError as err:
        print(what, type(err).__name__)
print(open('/proc/{neighbour_pid}/mem', 'rb').read(100))
""", "exit code 1", "FileNotFoundError"),
    "ctypes: setuid, new namespaces, mount, ptrace, kill": ("""
import ctypes
libc = ctypes.CDLL(None, use_errno=True)
results = {{'setuid': libc.setuid(0), 'unshare user': libc.unshare(0x10000000), 'unshare mount': libc.unshare(0x20000),
           'mount': libc.mount(b'none', b'/usr', b'tmpfs', 0, None), 'ptrace': libc.ptrace(16, {neighbour_pid}, 0, 0),
           'kill': libc.kill({host_pid}, 9)}}
print(results)
if 0 in results.values():
    print('ESCAPED')
if libc.setuid(0) != 0:
    raise OSError(ctypes.get_errno(), 'setuid(0) refused')
""", "exit code 1", "setuid(0) refused"),
    "importlib and os.system": ("""
import importlib, importlib.util
subprocess = importlib.import_module('subprocess')
print(subprocess.run(['id'], capture_output=True, text=True).stdout)
print('system', __import__('os').system('touch {outside}/from-system; echo pwned > /usr/from-system'))
spec = importlib.util.spec_from_file_location('verifier', '{verifier}')
spec.loader.exec_module(importlib.util.module_from_spec(spec))
""", "exit code 1", "FileNotFoundError"),
    "symlinks out of the working directory": ("""
import os
os.symlink('/usr/lib', 'lib')
try:
    open('lib/from-symlink', 'w')
except OSError as err:
    print('through a link', type(err).__name__)
os.symlink('{secret_file}', 'secret')
print(open('secret').read())
""", "exit code 1", "FileNotFoundError"),
    "hard links out of the working directory": ("""
import os, sys
try:
    os.link(os.path.realpath(sys.executable), 'python')
except OSError as err:
    print('link to the interpreter', type(err).__name__)
os.link('{secret_file}', 'secret')
""", "exit code 1", "FileNotFoundError"),
    "a process left running after the call": ("""
import os, subprocess, sys
subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)', '{marker}'], start_new_session=True,
                 stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
if os.fork() == 0:
    os.setsid()
    os.execv(sys.executable, [sys.executable, '-c', 'import time; time.sleep(60)', '{marker}'])
print('left running')
""", None, "left running"),
    "a fork bomb": ("""
import os, sys
if '{marker}' not in sys.argv:  # its processes named, so that the host can look for survivors
    os.execv(sys.executable, [sys.executable, '-c', open('main.py').read(), '{marker}'])
while True:
    os.fork()
""", "exit code 1", "Resource temporarily unavailable"),
    "filling the disk with one file": ("""
with open('fill', 'wb') as f:
    while True:
        f.write(b'x' * 2 ** 20)
""", "exit code 1", "File too large"),
    "filling the disk with many files": ("""
i = 0
while True:
    open(f'fill{{i}}', 'wb').write(b'x' * 2 ** 20)
    i += 1
""", "exit code 1", "No space left on device"),
    "connecting to the host's loopback": ("""
import socket
names = [line.split(':')[0].strip() for line in open('/proc/net/dev').read().splitlines()[2:]]
print('interfaces', names)
if names != ['lo']:
    print('ESCAPED')
try:
    socket.socket(socket.AF_UNIX).connect('\\0{abstract}')
except OSError as err:
    print('abstract socket', type(err).__name__)
socket.create_connection(('127.0.0.1', {port}), timeout=3)
""", "exit code 1", "ConnectionRefusedError"),
    "huge output": ("print('x' * 10 ** 7)", "output limit", "xxxx"),
    "signals to the trainer and its neighbours": ("""
import os, signal
for pid in ({neighbour_pid}, -{host_pgid}):
    try:
        os.kill(pid, signal.SIGKILL)
        print('ESCAPED', pid)
    except OSError as err:
        print(pid, type(err).__name__)
os.kill({host_pid}, signal.SIGTERM)
""", "exit code 1", "ProcessLookupError"),
    "kernel settings and devices": ("""
import os
print(sorted(os.listdir('/dev')))
for path in ('/proc/sys/kernel/hostname', '/proc/sysrq-trigger', '/dev/mem', '/dev/kmsg', '/dev/evil',
             '/sys/kernel/profiling'):
    try:
        open(path, 'w').write('1')
        print('ESCAPED', path)
    except OSError as err:
        print(path, type(err).__name__)
open('/proc/sys/vm/drop_caches', 'w').write('3')
""", "exit code 1", ("Read-only file system", "Permission denied")),
    "kernel interfaces that exploits lean on": ("""
import ctypes, errno, platform
libc = ctypes.CDLL(None, use_errno=True)
numbers = {{'x86_64': {{'io_uring_setup': 425, 'userfaultfd': 323, 'bpf': 321, 'perf_event_open': 298, 'keyctl': 250}},
           'aarch64': {{'io_uring_setup': 425, 'userfaultfd': 282, 'bpf': 280, 'perf_event_open': 241, 'keyctl': 219}}}}
results = {{}}
for name, number in numbers.get(platform.machine(), {{'io_uring_setup': 425}}).items():
    results[name] = (libc.syscall(number, 0, 0, 0, 0, 0), errno.errorcode.get(ctypes.get_errno()))
print(results)
if any(code != 'EPERM' for _, code in results.values()):  # reached the kernel's implementation
    print('ESCAPED')
raise OSError(ctypes.get_errno(), 'refused')
""", "exit code 1", "EPERM"),
    "file descriptors left open by the trainer": ("""
import os
fds = sorted(int(fd) for fd in os.listdir('/proc/self/fd'))
print('open', fds, [os.readlink(f'/proc/self/fd/{{fd}}') for fd in fds[3:] if os.path.exists(f'/proc/self/fd/{{fd}}')])
for fd in fds[3:]:
    try:
        print(fd, os.pread(fd, 200, 0))
    except OSError as err:
        print(fd, type(err).__name__)
""", None, "open [0, 1, 2"),
    "an endless loop": ("while True: pass", "cpu time limit", ""),
    "sleeping": ("import time; time.sleep(30)", "wall-clock limit", ""),
    "a memory hog": ("x = bytearray(4 * 1024 ** 3)", "memory limit", "MemoryError"),
}
WALL_S = {"sleeping": 2.0}  # elsewhere the wall clock is far above the CPU limit, so a loaded machine still
# hits the CPU limit first


def digest(path: str) -> str:
    return hashlib.sha256(open(path, "rb").read()).hexdigest()


def survivors(marker: str, wait_s: float = 2.0) -> list[int]:
    """Host processes whose command line carries `marker`, after up to `wait_s` for them to go."""
    deadline = time.time() + wait_s
    while True:
        found = []
        for path in glob.glob("/proc/[0-9]*/cmdline"):
            try:
                if marker.encode() in open(path, "rb").read():
                    found.append(int(path.split("/")[2]))
            except OSError:
                pass
        found = [pid for pid in found if pid != os.getpid()]
        if not found or time.time() > deadline:
            return found
        time.sleep(0.05)


@pytest.mark.parametrize("case", list(HOSTILE))
def test_hostile_code_is_contained_and_reported(host, case):
    facts, neighbour, tcp, unix = host
    if case == "kernel interfaces that exploits lean on":
        require(sandbox.seccomp_filter()[1] or None)  # libseccomp (pyseccomp, a dependency) builds the filter
    marker = f"rlft-marker-{uuid.uuid4().hex}"
    template, error, shows = HOSTILE[case]
    code = template.format(marker=marker, **facts)
    before = {path: digest(path) for path in (facts["verifier"], facts["stdlib"])}
    leaked = open(facts["secret_file"])  # inheritable by mistake: the sandbox still must not see it
    os.set_inheritable(leaked.fileno(), True)
    try:
        wall = WALL_S.get(case, 15.0)
        result = sandbox.run(code, sandbox.Limits(timeout_s=wall, cpu_s=1, memory_mb=512))
    finally:
        leaked.close()
    said = f"{case}: {result.error}\n{result.output[-1500:]}"
    # contained: nothing of the host reached or changed
    assert "ESCAPED" not in result.output and SECRET not in result.output, said
    assert sorted(os.listdir(facts["outside"])) == ["secret.txt"], said
    assert {path: digest(path) for path in before} == before, said
    assert not os.path.exists("/tmp/rlft-sandbox-escape") and not os.path.exists("/rlft-sandbox-escape"), said
    assert not os.path.exists("/usr/from-system"), said
    assert neighbour.poll() is None, said
    for server in (tcp, unix):
        with pytest.raises(BlockingIOError):
            server.accept()
    assert not survivors(marker), said
    # reported: the step's error and what the code printed
    assert (result.error is None) if error is None else (result.error or "").startswith(error), said
    assert any(text in result.output for text in ((shows,) if isinstance(shows, str) else shows)), said
    assert result.seconds < wall + 4, said


def test_a_rollouts_hostile_tool_calls_are_each_that_steps_error_and_the_run_goes_on(host):
    """Every case at once through env=python's steps, side by side as a rollout runs them: each trajectory gets
    its tool message with the error, nothing escapes, and the tool still answers the next call."""
    from omegaconf import OmegaConf

    from rlft.config.schema import Config
    from rlft.envs.python_tool import PythonEnv

    facts, neighbour, _, _ = host
    cfg = OmegaConf.structured(Config)
    cfg.env.name, cfg.env.instruction, cfg.env.timeout_s, cfg.env.cpu_s = "python", "", 15.0, 1
    env = PythonEnv(cfg)
    marker = f"rlft-marker-{uuid.uuid4().hex}"
    names = [name for name in HOSTILE if name != "sleeping"]
    blocks = [f"```python\n{HOSTILE[name][0].format(marker=marker, **facts)}\n```" for name in names]
    replies = env.steps([{}] * len(blocks), blocks)
    for name, reply in zip(names, replies):
        expected = HOSTILE[name][1]
        assert reply.tool_call and reply.role == "tool" and SECRET not in reply.content, (name, reply.content)
        assert (reply.error is None) if expected is None else reply.error.startswith(expected), (name, reply.error)
        if expected:
            assert f"[stopped: {reply.error}]" in reply.content
    assert neighbour.poll() is None and not survivors(marker)
    assert env.step({}, "```python\nprint(17 * 23)\n```").content == "391\n"
