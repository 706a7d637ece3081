"""What the experiment scripts (scripts/*.py) share: running one rlft command as a subprocess, timed, its
output to a log or the console, stopping the script with the log's last lines when it fails; and the
mean ± std cell of their tables. (The scripts build chains of `rlft train` / `rlft eval` commands the way a
user's shell script would; docs/results.md lists them.)"""
from __future__ import annotations

import os
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Optional


@dataclass(frozen=True)
class Finished:
    code: int  # the command's exit status
    seconds: float  # its wall time
    tail: str  # the last lines of its log ("" when it printed to the console)


def rlft_command(args: list[str], log: Optional[Path] = None, *, tag: str = "rlft", env: Optional[dict] = None,
                 cwd: Optional[Path] = None, check: bool = True) -> Finished:
    """`python -m rlft.cli <args>` with this interpreter. `log`: where its output goes (the command line first),
    else the console; `env`: variables added to this process's; `tag`: the prefix of the two lines printed (the
    command, then its time or failure). `check`: a failure stops the script (SystemExit naming the command and
    the log's last lines); without it the caller reads `code`."""
    line = "rlft " + " ".join(args)
    print(f"[{tag}] {line}", flush=True)
    cmd = [sys.executable, "-m", "rlft.cli", *args]
    full_env = {**os.environ, **env} if env else None
    tic = time.time()
    if log is None:
        code, tail = subprocess.run(cmd, env=full_env, cwd=cwd).returncode, ""
    else:
        log.parent.mkdir(parents=True, exist_ok=True)
        with open(log, "w") as f:
            f.write(line + "\n")
            f.flush()
            code = subprocess.run(cmd, env=full_env, cwd=cwd, stdout=f, stderr=subprocess.STDOUT).returncode
        tail = "\n".join(log.read_text(errors="replace").strip().splitlines()[-3:])
    seconds = time.time() - tic
    status = "done" if code == 0 else f"FAILED (exit {code})" + (f", log {log}" if log else "")
    print(f"[{tag}] {status} in {seconds:.0f} s: {line[:100]}", flush=True)
    if code and check:
        raise SystemExit(f"{tag}: `{line[:120]}` failed (exit {code})" + (f"; log {log}:\n{tail}" if log else
                                                                          "; see its message above"))
    return Finished(code, seconds, tail)


def cell(values: list, scale: float = 100.0, digits: int = 1) -> str:
    """`mean ± std` of the values present (× scale), the mean alone for one value, "–" for none."""
    values = [v for v in values if v is not None]
    if not values:
        return "–"
    mean = statistics.mean(values) * scale
    return f"{mean:.{digits}f}" + (f" ± {statistics.stdev(values) * scale:.{digits}f}" if len(values) > 1 else "")
