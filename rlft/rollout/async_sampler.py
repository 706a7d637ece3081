"""Asynchronous sampling (`rollout.max_staleness=K > 0`): a sampler process beside each training rank.

The sampler holds its own copy of the policy and its own rollout engine (hf or vllm) and runs the
environment's episodes. On CPU it has its own threads (`rollout.sampler_threads`). On a GPU it shares
the trainer rank's device: an hf engine holds its model there, a vllm engine takes
`rollout.vllm.gpu_memory_utilization` of the device's memory and stays awake (no sleep mode: it samples
while the trainer updates). The trainer sends it, in one ordered queue:

    ("weights", v, [(name, tensor), ...])   the policy after v rollouts' updates (LoRA: merged)
    ("sample", j, v, rows, prompt_ids, n, sampling, seed)
                                            rollout j's trajectories, from weights version v

and it answers ("synced", v, fingerprint) and ("sampled", j, v, generations, seconds) in the same order.

The schedule is fixed: rollout j is sampled from version max(0, j - K), so while the trainer updates
on rollout r, the sampler is already sampling rollouts r+1 .. r+K. A rollout is never more than K
versions older than the weights it trains (staleness min(r, K)), and the run does not depend on how
fast either side is: with the same seed, every sample is the same. The behaviour policy is the
sampler's version; the loss corrects for it with the recorded log-probs (rollout.is_correction,
docs/algorithms.md "Asynchronous RL").

Weight-sync safety: the sampler reports the version it holds and a fingerprint of its weights after
loading them (exactly rounded sums of evenly spaced elements of a few named tensors: the same on any
device and thread count); the trainer compares it with the fingerprint of the weights it sent. A sample request for a version the sampler does not hold, or a fingerprint that
differs, stops the run with an error naming the version, never a silent run on old weights.
"""
from __future__ import annotations

import math
import os
import queue
import time
import traceback
from contextlib import contextmanager
from dataclasses import dataclass

import torch

FINGERPRINT_TENSORS = 6
FINGERPRINT_ELEMENTS = 4096  # per tensor, evenly spaced


def fingerprint(named: list[tuple[str, torch.Tensor]]) -> tuple:
    """(name, sum) of a few tensors spread over the sorted names, each sum over evenly spaced elements and
    exactly rounded (math.fsum): cheap, equal wherever the same weights are held (a float64 tensor sum
    depends on the device and, for a large tensor, on the thread count), and different when a sync did
    not reach the sampler (an update changes every element)."""
    by_name = dict(named)
    names = sorted(by_name)
    if not names:
        return ()
    step = max(1, len(names) // FINGERPRINT_TENSORS)
    picked = names[::step][:FINGERPRINT_TENSORS] + [names[-1]]
    return tuple((name, spaced_sum(by_name[name])) for name in dict.fromkeys(picked))


def spaced_sum(tensor: torch.Tensor) -> float:
    flat = tensor.detach().flatten()
    return math.fsum(flat[::max(1, flat.numel() // FINGERPRINT_ELEMENTS)].double().cpu().tolist())


def load_weights(model: torch.nn.Module, named: list[tuple[str, torch.Tensor]]) -> None:
    """Copy the trainer's weights into the sampler's model by name (a name it does not have is an error)."""
    params = dict(model.named_parameters(remove_duplicate=False))
    with torch.no_grad():
        for name, tensor in named:
            if name not in params:
                raise KeyError(f"the sampler's model has no parameter {name}")
            params[name].copy_(tensor)


def sampler_cfg(cfg_dict: dict, beside_trainer: dict) -> dict:
    """The sampler's own settings: the run's, with the rollout engine's `beside_trainer` settings (EngineSpec;
    e.g. a vLLM engine never sleeps, it samples while the trainer updates) merged into rollout.*."""
    rollout = dict(cfg_dict["rollout"])
    for key, value in beside_trainer.items():
        rollout[key] = {**rollout[key], **value} if isinstance(value, dict) else value
    return {**cfg_dict, "rollout": rollout}


def gpu_environment(device: torch.device) -> dict[str, str]:
    """Environment variables that give a sampler process the trainer rank's GPU as its only one (cuda:0
    there): the physical index behind `device`, read through this process's CUDA_VISIBLE_DEVICES."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    ids = [v.strip() for v in visible.split(",")] if visible else None
    index = device.index if device.index is not None else torch.cuda.current_device()
    return {"CUDA_VISIBLE_DEVICES": ids[index] if ids else str(index)}


def serve(cfg_dict: dict, model_path: str, threads: int, inbox, outbox, stopping, load=load_weights,
          device_type: str = "cpu") -> None:
    """The sampler's loop (its own process; a thread in tests): build the model, engine and environment,
    then answer the trainer's messages in order until ("stop",). Once `stopping` is set, sample requests
    still queued are skipped (the run is over; they would not be trained). `device_type` cuda: the
    process sees one GPU, the trainer rank's; an hf engine holds the model there, a vllm engine takes
    rollout.vllm.gpu_memory_utilization of it and the model stays in CPU memory as its weights' source."""
    try:
        from omegaconf import OmegaConf

        from rlft import envs
        from rlft.envs import episodes
        from rlft.models import load_model, load_tokenizer
        from rlft.rollout.generate import ENGINE_SPECS, Frozen, choose_engine

        if threads > 0:
            torch.set_num_threads(threads)
        device = torch.device("cuda", 0) if device_type == "cuda" else torch.device("cpu")
        spec = ENGINE_SPECS[choose_engine(cfg_dict["rollout"]["engine"], device)[0]]
        cfg = OmegaConf.create(sampler_cfg(cfg_dict, spec.beside_trainer))
        tokenizer = load_tokenizer(cfg.model, model_path)
        dtype = torch.bfloat16 if cfg.deepspeed.precision == "bf16" else torch.float32
        model = load_model(cfg.model, model_path, tokenizer, seed=cfg.seed, dtype=dtype)
        model.requires_grad_(False)
        if spec.model_on_device:
            model.to(device)
        engine = spec.build(cfg, Frozen(model), tokenizer, device, cfg.seed)
        env = envs.build(cfg, tokenizer)
        limits = episodes.limits(cfg, env, tokenizer)
        where = "the rank's GPU" if device.type == "cuda" else f"CPU, {torch.get_num_threads()} thread(s)"
        outbox.put(("ready", f"{engine.describe()} on {where}"))
    except Exception:  # noqa: BLE001 - reported to the trainer, which stops the run
        outbox.put(("error", traceback.format_exc()))
        return
    version, parent = None, os.getppid()
    while True:
        try:
            message = inbox.get(timeout=5.0)
        except queue.Empty:
            if os.getppid() != parent:  # the trainer is gone (killed, or ended without closing): so is its sampler
                return
            continue
        kind = message[0]
        try:
            if kind == "stop":
                engine.close()
                return
            if kind == "weights":
                _, version, named = message
                load(model, named)
                engine.sync_weights(version)
                outbox.put(("synced", version,
                            fingerprint([(n, p.detach()) for n, p in model.named_parameters(remove_duplicate=False)])))
            elif kind == "sample" and not stopping.is_set():
                _, index, wanted, rows, prompt_ids, n, sampling, seed = message
                if wanted != version:
                    outbox.put(("error", f"rollout {index} is to be sampled from weights version {wanted}, but the "
                                         f"sampler holds version {version}: a weight sync did not arrive"))
                    continue
                tic = time.time()
                torch.manual_seed(seed)  # hf draws from torch's generator; vllm seeds each request
                gens = episodes.sample(engine, env, rows, prompt_ids, n, sampling, seed, tokenizer, limits)
                outbox.put(("sampled", index, version, gens, time.time() - tic))
        except Exception:  # noqa: BLE001
            outbox.put(("error", traceback.format_exc()))


@contextmanager
def environment(values: dict[str, str]):
    """os.environ with `values` set, restored afterwards."""
    before = {k: os.environ.get(k) for k in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for k, v in before.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


class SamplerError(RuntimeError):
    """The sampler process failed, or its weights are not the version the trainer sent."""


@dataclass
class Pending:
    """A rollout asked of the sampler: what the trainer needs to build it when it arrives."""
    rows: list
    prompt_texts: list
    prompt_ids: list
    version: int


class AsyncSampler:
    """The trainer's side: pushes weights, asks for rollouts ahead, and hands each rollout's generations
    over with the version that sampled them."""

    def __init__(self, cfg, model_path: str, *, threads: int = 1, device: torch.device | None = None,
                 in_process: bool = False, load=load_weights, timeout_s: float = 3600.0):
        from omegaconf import OmegaConf

        self.max_staleness = int(cfg.rollout.max_staleness)
        self.timeout_s = timeout_s
        self.pending: dict[int, Pending] = {}
        self.done: dict[int, tuple[int, object, float]] = {}  # rollout -> (version, generations, seconds sampling)
        self.expected: dict[int, tuple] = {}  # version -> fingerprint of what was sent
        self.sent_version: int | None = None
        cfg_dict = OmegaConf.to_container(cfg, resolve=True)
        if in_process:  # tests: the same loop in a thread
            import threading

            self.inbox, self.outbox, self.stopping = queue.Queue(), queue.Queue(), threading.Event()
            self.worker = threading.Thread(target=serve, args=(cfg_dict, model_path, threads, self.inbox,
                                                               self.outbox, self.stopping, load), daemon=True)
            self.worker.start()
        else:
            import torch.multiprocessing as mp

            on_gpu = device is not None and device.type == "cuda"
            ctx = mp.get_context("spawn")
            self.inbox, self.outbox, self.stopping = ctx.Queue(), ctx.Queue(), ctx.Event()
            self.worker = ctx.Process(target=serve, args=(cfg_dict, model_path, threads, self.inbox, self.outbox,
                                                          self.stopping, load_weights, "cuda" if on_gpu else "cpu"),
                                      daemon=True)
            with environment(gpu_environment(device) if on_gpu else {}):  # a spawned child copies os.environ
                self.worker.start()
        self.description = self._receive()[1]  # ("ready", the engine's description)

    def describe(self) -> str:
        return f"a sampler process beside the trainer ({self.description}), at most {self.max_staleness} " \
               f"version(s) behind"

    # ------------------------------------------------------------------ messages
    def _receive(self):
        try:
            message = self.outbox.get(timeout=self.timeout_s)
        except queue.Empty:
            raise SamplerError(f"the sampler sent nothing for {self.timeout_s:.0f} s") from None
        if message[0] == "error":
            raise SamplerError(f"the sampler failed: {message[1].strip().splitlines()[-1]}\n{message[1]}")
        if message[0] == "synced":
            _, version, got = message
            if got != self.expected.pop(version):
                raise SamplerError(f"the sampler's weights after the sync of version {version} are not the trainer's "
                                   "(fingerprints differ): the weights did not reach it")
        return message

    def push(self, version: int, named) -> None:
        """Send the policy's weights of `version` (copies: the trainer goes on training its own)."""
        tensors = [(name, t.detach().to("cpu", copy=True)) for name, t in named]
        self.expected[version] = fingerprint(tensors)
        self.inbox.put(("weights", version, tensors))
        self.sent_version = version

    def ask(self, index: int, version: int, rows, prompt_texts, prompt_ids, n: int, sampling, seed: int) -> None:
        if version != self.sent_version:
            raise SamplerError(f"rollout {index} wants weights version {version}, last sent {self.sent_version}")
        self.pending[index] = Pending(rows, prompt_texts, prompt_ids, version)
        self.inbox.put(("sample", index, version, rows, prompt_ids, n, sampling, seed))

    def _wait_for(self, index: int) -> None:
        while index not in self.done:
            message = self._receive()
            if message[0] == "sampled":
                _, j, version, gens, seconds = message
                self.done[j] = (version, gens, seconds)

    def take(self, index: int) -> tuple[Pending, object, float]:
        """Rollout `index`'s request, its generations and the sampler's seconds on it (waiting for them)."""
        self._wait_for(index)
        version, gens, seconds = self.done.pop(index)
        request = self.pending.pop(index)
        if version != request.version:
            raise SamplerError(f"rollout {index} came from version {version}, asked of version {request.version}")
        return request, gens, seconds

    def drain(self) -> dict[int, tuple[Pending, object]]:
        """Every rollout asked and not yet taken, waited for: a checkpoint stores them, so a resumed run
        trains exactly the samples the uninterrupted run would have."""
        for index in sorted(self.pending):
            self._wait_for(index)
        return {j: (self.pending[j], self.done[j][1]) for j in sorted(self.pending)}

    def restore(self, saved: dict[int, tuple[Pending, object]]) -> None:
        """Rollouts a checkpoint stored as in flight: taken from there, not sampled again."""
        for j, (request, gens) in saved.items():
            self.pending[j] = request
            self.done[j] = (request.version, gens, 0.0)

    def close(self) -> None:
        if self.worker is None:
            return
        try:
            self.stopping.set()  # the rollouts still asked (up to K past the last trained one) are not sampled
            self.inbox.put(("stop",))
            self.worker.join(timeout=60)
        finally:
            if hasattr(self.worker, "terminate") and self.worker.is_alive():
                self.worker.terminate()
            self.worker = None
