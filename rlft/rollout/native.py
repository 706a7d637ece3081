"""rlft's CPU decoding kernel (csrc/decode_cpu.cpp): one fp32 decoding step of a Llama-family
decoder with the element-wise work fused into a few loops and the attention over the cache written
out by hand (keys cached transposed, so a query's scores over all columns are contiguous
multiply-adds). The matrix products stay ATen's.

It is compiled with the machine's C++ compiler on first use (about half a minute), for this CPU
(-march=native), into a cache directory keyed by the source, the flags, the CPU and the torch
version (RLFT_KERNEL_CACHE, else ~/.cache/rlft/kernels); later runs load it from there. Where it
cannot be built (no compiler, no OpenMP), `kernel()` raises KernelUnavailable with the compiler's
first error line and the lean sampler keeps its PyTorch decoding step.
"""
from __future__ import annotations

import hashlib
import os
import platform
from pathlib import Path

import torch

SOURCE = Path(__file__).with_name("csrc") / "decode_cpu.cpp"
FLAGS = ["-O3", "-march=native", "-fopenmp", "-fno-trapping-math"]
NAME = "rlft_decode_cpu"
_loaded: dict[str, object] = {}


class KernelUnavailable(RuntimeError):
    """The CPU decoding kernel could not be built or loaded here (the message says why)."""


def cpu_signature() -> str:
    """The machine and its instruction-set flags (a kernel built with -march=native runs only there)."""
    flags = ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith(("flags", "Features")):
                flags = line
                break
    except OSError:
        pass
    return f"{platform.machine()} {flags}"


def cache_dir() -> Path:
    root = os.environ.get("RLFT_KERNEL_CACHE") or Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") \
        / "rlft" / "kernels"
    key = "\n".join([SOURCE.read_text(), " ".join(FLAGS), cpu_signature(), torch.__version__])
    return Path(root) / f"{NAME}-{hashlib.sha256(key.encode()).hexdigest()[:16]}"


def kernel():
    """The compiled kernel module (built on first use); KernelUnavailable if it cannot be."""
    if "module" in _loaded:
        return _loaded["module"]
    if "error" in _loaded:
        raise KernelUnavailable(_loaded["error"])
    try:
        from torch.utils.cpp_extension import load

        build = cache_dir()
        build.mkdir(parents=True, exist_ok=True)
        if not (build / f"{NAME}.so").exists():
            print(f"[rlft] compiling the CPU decoding kernel (once per machine, ~30 s) into {build}", flush=True)
        _loaded["module"] = load(NAME, [str(SOURCE)], extra_cflags=FLAGS, build_directory=str(build),
                                 verbose=False)
    except Exception as e:  # noqa: BLE001 -- any build or load failure leaves the PyTorch step in use
        lines = [ln.strip() for ln in str(e).splitlines() if "error" in ln.lower()] or [str(e).strip()]
        _loaded["error"] = f"{type(e).__name__}: {lines[0][:300]}"
        raise KernelUnavailable(_loaded["error"]) from None
    return _loaded["module"]


def unavailable_reason() -> str | None:
    """Why the kernel cannot be used here (None when it can); builds it if needed."""
    try:
        kernel()
    except KernelUnavailable as e:
        return str(e)
    return None
