"""Process-group set-up and the few collectives the stages need.

One code path for CPU (gloo) and GPU (nccl). Ranks are started either by the driver itself
(one rank, in-process) or by torch.distributed.run, which sets RANK / WORLD_SIZE / LOCAL_RANK.
"""
from __future__ import annotations

import os
import socket
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class DistInfo:
    rank: int
    world_size: int
    local_rank: int
    local_world_size: int
    device: torch.device

    @property
    def is_main(self) -> bool:
        return self.rank == 0


_INFO: DistInfo | None = None
_AT_SHUTDOWN: list = []  # callables run before the process group goes (e.g. closing a colocated vLLM)


def at_shutdown(fn) -> None:
    """Run `fn()` in `shutdown`, after the final barrier and before the process group is destroyed."""
    _AT_SHUTDOWN.append(fn)


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def pick_device(requested: str) -> torch.device:
    if requested == "cpu" or (requested == "auto" and not torch.cuda.is_available()):
        return torch.device("cpu")
    if not torch.cuda.is_available():
        raise RuntimeError("deepspeed.device=cuda but no CUDA device is visible; use deepspeed.device=cpu")
    return torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0)))


def init(deepspeed_cfg) -> DistInfo:
    """Join (or create) the process group (the `deepspeed` config section: device, backend, threads); idempotent
    within a process."""
    global _INFO
    if _INFO is not None:
        return _INFO
    os.environ.setdefault("RANK", "0")
    os.environ.setdefault("WORLD_SIZE", "1")
    os.environ.setdefault("LOCAL_RANK", "0")
    os.environ.setdefault("LOCAL_WORLD_SIZE", "1")
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", str(free_port()))
    device = pick_device(deepspeed_cfg.device)
    backend = deepspeed_cfg.backend
    if backend == "auto":
        backend = "nccl" if device.type == "cuda" else "gloo"
    if device.type == "cuda":
        torch.cuda.set_device(device)
    local_world = int(os.environ["LOCAL_WORLD_SIZE"])
    threads = deepspeed_cfg.threads_per_rank or max(1, (os.cpu_count() or 1) // local_world)
    torch.set_num_threads(threads)

    import deepspeed

    if not torch.distributed.is_initialized():
        deepspeed.init_distributed(dist_backend=backend, auto_mpi_discovery=False)
    _INFO = DistInfo(rank=int(os.environ["RANK"]), world_size=int(os.environ["WORLD_SIZE"]),
                     local_rank=int(os.environ["LOCAL_RANK"]), local_world_size=local_world, device=device)
    return _INFO


def shutdown() -> None:
    """Leave the process group once every rank is done.

    Exiting with the group still alive lets the interpreter tear down the communication threads
    of one rank while a peer still talks to it, which can abort a finished run at exit.
    """
    global _INFO
    if torch.distributed.is_initialized():
        torch.distributed.barrier()
    while _AT_SHUTDOWN:
        _AT_SHUTDOWN.pop()()
    if torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()
    _INFO = None


def info() -> DistInfo:
    if _INFO is None:
        raise RuntimeError("rlft.dist.init() has not been called")
    return _INFO


def print0(*args, **kwargs) -> None:
    """print on rank 0 only (every rank when not initialised)."""
    if _INFO is None or _INFO.is_main:
        print(*args, **kwargs, flush=True)


def barrier() -> None:
    if torch.distributed.is_initialized():
        torch.distributed.barrier()


def all_reduce_sum(values: list[float]) -> list[float]:
    """Sum a few floats over ranks (in float64 on the rank's device)."""
    t = torch.tensor(values, dtype=torch.float64, device=info().device)
    if torch.distributed.is_initialized() and info().world_size > 1:
        torch.distributed.all_reduce(t)
    return t.tolist()


def all_reduce_max(values: list[float]) -> list[float]:
    """The largest of a few floats over ranks (every rank must pass the same number of values)."""
    if not values:
        return []
    t = torch.tensor(values, dtype=torch.float64, device=info().device)
    if torch.distributed.is_initialized() and info().world_size > 1:
        torch.distributed.all_reduce(t, op=torch.distributed.ReduceOp.MAX)
    return t.tolist()


def sum_over_ranks(t: torch.Tensor) -> torch.Tensor:
    """A small tensor summed over ranks (a copy; the input itself when there is one rank)."""
    if not torch.distributed.is_initialized() or info().world_size == 1:
        return t
    out = t.detach().to(info().device, torch.float64)
    torch.distributed.all_reduce(out)
    return out.to(t.device, t.dtype)


def all_gather_object(obj) -> list:
    """Every rank's Python object, in rank order, on every rank (collective)."""
    if not torch.distributed.is_initialized() or info().world_size == 1:
        return [obj]
    out = [None] * info().world_size
    torch.distributed.all_gather_object(out, obj)
    return out
