"""What every stage shares: its context, the deterministic data order, resume and finish.

Every stage's loop is `training_loop`: train a unit, then progress, logging, evaluation, checkpoints and a
clean stop on a signal. The supervised stages (SFT, RM, PRM, DPO, RFT) differ only in how a micro-batch
becomes a loss; they share `supervised_loop`: for each optimizer step, take this rank's share of the
global batch, accumulate micro-batch gradients, step.
"""
from __future__ import annotations

import random
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Sequence

import numpy as np
import torch

from rlft import dist, microbatch, signals
from rlft.config.arithmetic import samples_per_step
from rlft.errors import Interrupted, StageError
from rlft.files import checkpoints, handoff
from rlft.tracking import Tracker
from rlft.trainer import Trainer


@dataclass
class StageContext:
    cfg: object
    info: dist.DistInfo
    run_dir: Path

    @property
    def ckpt_root(self) -> Path:
        return self.run_dir / "checkpoints"


def prepare_run_dir(ctx: StageContext) -> None:
    """A fresh (non-resumed) stage starts clean: no stale checkpoints, manifest or final/."""
    if ctx.info.is_main and not ctx.cfg.resume:
        shutil.rmtree(ctx.ckpt_root, ignore_errors=True)
        (ctx.run_dir / "manifest.json").unlink(missing_ok=True)
    dist.barrier()


def step_indices(step: int, batch_size: int, num_examples: int, seed: int) -> list[int]:
    """Global example indices of optimizer step `step`: consecutive epochs of seeded shuffles.

    A pure function of (step, seed): resuming at step s reproduces the same data order."""
    out = []
    for pos in range(step * batch_size, (step + 1) * batch_size):
        epoch, i = divmod(pos, num_examples)
        out.append(int(_permutation(num_examples, seed + epoch)[i]))
    return out


_PERMS: dict[tuple[int, int], np.ndarray] = {}


def _permutation(n: int, seed: int) -> np.ndarray:
    key = (n, seed)
    if key not in _PERMS:
        _PERMS.clear() if len(_PERMS) > 4 else None
        _PERMS[key] = np.random.default_rng(seed).permutation(n)
    return _PERMS[key]


def rank_share(indices: Sequence[int], rank: int, world: int) -> list[int]:
    """This rank's contiguous share of a global batch."""
    per_rank = len(indices) // world
    return list(indices[rank * per_rank:(rank + 1) * per_rank])


def rng_state() -> dict:
    return {"torch": torch.get_rng_state(), "numpy": np.random.get_state(), "python": random.getstate()}


def set_rng_state(state: dict) -> None:
    torch.set_rng_state(state["torch"])
    np.random.set_state(state["numpy"])
    random.setstate(state["python"])


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def maybe_resume(ctx: StageContext, trainer: Trainer) -> int:
    """Load the newest checkpoint when resume=true; returns the step to continue from."""
    return int(resume_state(ctx, trainer).get("step", 0))


def resume_state(ctx: StageContext, trainer: Trainer, companions: dict | None = None) -> dict:
    """Load the newest intact checkpoint when resume=true (RNG restored, companion engines too);
    returns its client state ({} when starting fresh): the step and whatever else the stage saved."""
    if not ctx.cfg.resume:
        return {}
    path = checkpoints.intact_checkpoint(ctx.ckpt_root)
    if path is None:
        dist.print0(f"resume=true but no checkpoint under {ctx.ckpt_root}; starting from step 0")
        return {}
    checkpoints.check_resume_config(checkpoints.saved_config(path), ctx.cfg, path)
    try:
        state = trainer.load_checkpoint(path, companions)
    except Exception as exc:  # a checkpoint without checksums (older rlft) can still be unreadable
        raise StageError(f"cannot load checkpoint {path}: {type(exc).__name__}: {' '.join(str(exc).split())[:200]}; "
                         f"remove it to resume from an older one, or rerun without resume=true") from None
    set_rng_state(state["rng"])
    dist.print0(f"resumed from {path} at step {state['step']}")
    return state


class Sums:
    """Metric sums and counts on this rank; `reduce` sums them over ranks and divides, so every
    logged metric is a mean over all ranks' items (tokens, sequences, pairs, steps)."""

    def __init__(self):
        self.values: dict[str, list[float]] = {}
        self.maxima: dict[str, float] = {}

    def add(self, name: str, total: float, count: float) -> None:
        acc = self.values.setdefault(name, [0.0, 0.0])
        acc[0] += float(total)
        acc[1] += float(count)

    def add_all(self, stats: dict[str, tuple[float, float]]) -> None:
        """Add {name: (sum, count)}, what a stage's loss function reports."""
        for name, (total, count) in stats.items():
            self.add(name, total, count)

    def add_max(self, name: str, value: float) -> None:
        self.maxima[name] = max(self.maxima.get(name, float("-inf")), float(value))

    def reduce(self) -> dict:
        """Collective: every rank must call it."""
        names = sorted(self.values)
        flat = dist.all_reduce_sum([v for n in names for v in self.values[n]])
        out = {n: flat[2 * i] / max(flat[2 * i + 1], 1e-12) for i, n in enumerate(names)}
        maxima = sorted(self.maxima)
        out.update(zip(maxima, dist.all_reduce_max([self.maxima[n] for n in maxima])))
        return out


LossFn = Callable[[torch.nn.Module, list, float], tuple[torch.Tensor, dict]]


def example_sequences(example: dict) -> list[int]:
    """Token lengths of the sequences one example puts through the model (a preference pair: two)."""
    if "input_ids" in example:
        return [len(example["input_ids"])]
    return [len(example["chosen_ids"]), len(example["rejected_ids"])]


def optimizer_step(trainer: Trainer, examples: list, indices: list[int], count_fn: Callable[[list], float],
                   loss_fn: LossFn, train_cfg, sums: Sums) -> None:
    """One optimizer step on the global batch `indices`: this rank's share, micro-batch by micro-batch
    (train.micro_batch_per_device examples, or a token budget: rlft.microbatch), each loss divided by
    count_fn(global batch) (tokens, pairs or steps of the whole step)."""
    info = dist.info()
    denom = float(count_fn([examples[i] for i in indices]))
    mine = rank_share(indices, info.rank, info.world_size)
    parts = microbatch.plan_for(train_cfg, [example_sequences(examples[i]) for i in mine])
    sums.add("micro_batches", len(parts), 1)  # forwards per rank in this step
    for k, part in enumerate(parts):
        loss, stats = loss_fn(trainer, [examples[mine[j]] for j in part], denom)
        trainer.backward(loss, last=k == len(parts) - 1)
        trainer.step()
        sums.add_all(stats)


def held_out(trainer: Trainer, examples: list, loss_fn: LossFn, micro: int, prefix: str = "eval_") -> dict:
    """The loss function's metrics over held-out examples (no gradient, eval mode), sharded over ranks."""
    info = dist.info()
    shard = examples[info.rank::info.world_size]
    sums = Sums()
    with trainer.evaluating():
        for i in range(0, len(shard), micro):
            sums.add_all(loss_fn(trainer, shard[i:i + micro], 1.0)[1])
    return {prefix + name: value for name, value in sums.reduce().items()}


def crossed(done: int, steps: int, every: int) -> bool:
    """Whether a unit of `steps` optimizer steps that ended at step `done` passed a multiple of `every` (0: never):
    a loop whose units are several steps long (an RL rollout's) logs, evaluates and saves at the first unit end
    at or after each multiple, instead of only where a multiple falls on a unit end."""
    return every > 0 and done // every > (done - steps) // every


def training_loop(ctx: StageContext, trainer: Trainer, start_step: int, run_unit: Callable[[int], None],
                  logged: Callable[[int], dict], *, steps_per_unit: int = 1, evaluate: Callable[[], dict] | None = None,
                  eval_every: int = 0, eval_at_start: bool = False, client_state: Callable[[], dict] = dict,
                  companions: dict | None = None) -> dict:
    """The skeleton of every stage's loop; returns the last logged metrics with the final evaluation.

    For each unit (an optimizer step, or an RL rollout of `steps_per_unit` steps) from the one `start_step`
    falls in: `run_unit(unit)` trains it; then progress (rate, ETA), and at train.log_every the metrics
    `logged(done)` go to the console, metrics.jsonl and wandb, and a held-out `evaluate()` every `eval_every`
    steps (on its own line when that is not a logging step); a checkpoint (the step, the RNG and
    `client_state()`, with the companions' state) is written every train.save_every steps, and on
    SIGINT/SIGTERM before stopping; each "every N steps" at the first unit end at or past each multiple of N
    (`crossed`). `evaluate` runs once more at the end."""
    train = ctx.cfg.train
    tracker = Tracker(ctx.run_dir, ctx.cfg, ctx.info.is_main, train.max_steps, start_step)
    last: dict = {}
    if eval_at_start and start_step == 0 and evaluate is not None and eval_every:
        tracker.log(0, evaluate())
    for unit in range(start_step // steps_per_unit, train.max_steps // steps_per_unit):
        run_unit(unit)
        done = (unit + 1) * steps_per_unit
        tracker.advance(steps_per_unit)
        log_now = crossed(done, steps_per_unit, train.log_every) or done == train.max_steps
        eval_now = evaluate is not None and crossed(done, steps_per_unit, eval_every) and done != train.max_steps
        record = logged(done) if log_now else {}
        if eval_now:
            record.update(evaluate())
        if record:
            tracker.log(done, record)
            last = record if log_now else {**last, **record}

        def save(done=done):
            state = {"step": done, "rng": rng_state(), **client_state()}
            return trainer.save_checkpoint(ctx.ckpt_root, done, state, train.keep_checkpoints, companions)

        if crossed(done, steps_per_unit, train.save_every) and done != train.max_steps:
            save()
        stop_if_signalled(ctx, done, save)
    if evaluate is not None:
        final_eval = evaluate()
        last.update(final_eval)
        tracker.log(train.max_steps, final_eval)
    tracker.close()
    return last


def supervised_loop(ctx: StageContext, trainer: Trainer, examples: list, count_fn: Callable[[list], float],
                    loss_fn: LossFn, evaluate: Callable[[], dict] | None = None, eval_every: int = 0) -> dict:
    """Train for train.max_steps optimizer steps of the supervised stages; returns the last logged metrics.

    count_fn(global batch) is the loss normaliser for the whole optimizer step (tokens,
    pairs or steps), so every micro-batch loss is `sum / global count` and the update does
    not depend on micro-batch size or world size. loss_fn returns (loss, {name: (sum, count)})."""
    cfg, train = ctx.cfg, ctx.cfg.train
    sums, timing = Sums(), {"seconds": 0.0, "steps": 0}

    def run_step(step: int) -> None:
        tic = time.time()
        optimizer_step(trainer, examples, step_indices(step, train.batch_size, len(examples), cfg.seed), count_fn,
                       loss_fn, train, sums)
        timing["seconds"] += time.time() - tic
        timing["steps"] += 1

    def logged(done: int) -> dict:
        nonlocal sums
        metrics = sums.reduce()
        metrics.update(lr=trainer.lr(), step_time_s=timing["seconds"] / timing["steps"],
                       samples_seen=done * samples_per_step(cfg))
        if trainer.grad_norm() is not None:
            metrics["grad_norm"] = trainer.grad_norm()
        sums, timing["seconds"], timing["steps"] = Sums(), 0.0, 0
        return metrics

    return training_loop(ctx, trainer, maybe_resume(ctx, trainer), run_step, logged, evaluate=evaluate,
                         eval_every=eval_every)


def stop_if_signalled(ctx: StageContext, done: int, save: Callable[[], Path]) -> None:
    """After optimizer step `done`: when any rank got SIGINT/SIGTERM, write a checkpoint (unless
    train.save_on_signal=false or this step's is already written) and stop with a one-line error."""
    why = signals.stop_requested()
    if not why:
        return
    train = ctx.cfg.train
    if done == train.max_steps:
        return  # the stage is finishing anyway
    existing = checkpoints.step_dir(ctx.ckpt_root, done)
    path = existing if existing.is_dir() else (save() if train.save_on_signal else None)
    raise Interrupted(f"stopped by {why} after step {done}/{train.max_steps}; "
                              + (f"checkpoint {path}; continue with the same command and resume=true" if path else
                                 "no checkpoint written (train.save_on_signal=false)"))


def peak_memory_gb(device) -> float:
    """This process's peak memory so far: the GPU's peak allocation on CUDA, else the peak resident set."""
    if getattr(device, "type", "cpu") == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**30
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20  # KiB on Linux


def finish(ctx: StageContext, trainer: Trainer, tokenizer, parent: str, summary: dict) -> None:
    """Export final/ and write the manifest (last, so a crash leaves the stage incomplete); the summary
    gets each rank's peak memory (peak_memory_gb_per_rank, and their maximum)."""
    trainer.export_hf(ctx.run_dir / "final", tokenizer)
    per_rank = [round(x, 3) for x in dist.all_gather_object(peak_memory_gb(ctx.info.device))]
    summary.update(peak_memory_gb=max(per_rank), peak_memory_gb_per_rank=per_rank)
    if ctx.info.device.type == "cpu":  # the process's own share of a CPU peak (rlft.memory)
        from rlft.models import memory_before_model_gb

        before = dist.all_gather_object(memory_before_model_gb() or 0.0)
        summary.update(memory_before_model_gb_per_rank=[round(x, 3) for x in before])
    if ctx.info.is_main:
        from rlft.stages.inputs import data_description

        handoff.write_manifest(ctx.run_dir, stage=ctx.cfg.algo.name, parent=parent, summary=summary,
                               run_name=ctx.cfg.run.name, data=data_description(ctx.cfg))
        dist.print0(f"wrote {ctx.run_dir / 'final'}")
    dist.barrier()
