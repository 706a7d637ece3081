"""The training engine: the only place that imports deepspeed.

`Engine` wraps a DeepSpeed engine (ZeRO 0-3, fp32/bf16, gradient accumulation, clipping,
warm-up + decay schedule) and adds what the stages need around it: resumable checkpoints
written atomically, Hugging Face export of the full weights (gathered under ZeRO-3), and
a context that gathers ZeRO-3 parameters once for a whole generation phase.

Loss scaling contract: a stage computes, per micro-batch, `sum of per-item losses / global
count of items in the optimizer step` (see rlft.algos aggregation) and calls `backward`.
DeepSpeed averages gradients over ranks, so `backward` multiplies by the world size and
does not divide by the accumulation steps: the optimizer then sees exactly the gradient of
the full-batch loss, whatever the micro-batch size or number of ranks.
"""
from __future__ import annotations

import contextlib
import os
import shutil
from pathlib import Path

import torch

from rlft.config import grad_accum_steps
from rlft.engine import dist


def make_scheduler(optimizer: torch.optim.Optimizer, t) -> torch.optim.lr_scheduler.LambdaLR:
    """transformers' warmup-stable-decay schedule: linear warm-up over `train.warmup_steps` from
    min_lr_ratio x lr to lr, then constant (lr_schedule=constant) or a cosine / linear decay to
    min_lr_ratio x lr at train.max_steps. The first step already has a non-zero rate."""
    from transformers import get_scheduler

    warmup = min(t.warmup_steps, t.max_steps)
    decay = 0 if t.lr_schedule == "constant" else t.max_steps - warmup
    return get_scheduler("warmup_stable_decay", optimizer, num_warmup_steps=warmup, scheduler_specific_kwargs=dict(
        num_stable_steps=t.max_steps - warmup - decay, num_decay_steps=decay, min_lr_ratio=t.min_lr_ratio,
        decay_type="cosine" if t.lr_schedule == "constant" else str(t.lr_schedule)))


def deepspeed_config(cfg, trainable: bool = True) -> dict:
    t, e = cfg.train, cfg.engine
    ds = {
        "train_batch_size": t.batch_size,
        "train_micro_batch_size_per_gpu": t.micro_batch_per_device,
        "gradient_accumulation_steps": grad_accum_steps(cfg),
        "gradient_clipping": float(t.grad_clip),
        "zero_optimization": {"stage": e.zero_stage},
        "bf16": {"enabled": e.precision == "bf16"},
        "fp16": {"enabled": False},
        "zero_allow_untested_optimizer": True,
        "steps_per_print": 10**9,
        "wall_clock_breakdown": False,
    }
    if e.offload_optimizer and e.zero_stage > 0:
        ds["zero_optimization"]["offload_optimizer"] = {"device": "cpu"}
    if e.zero_stage == 3:
        ds["zero_optimization"]["stage3_gather_16bit_weights_on_model_save"] = True
    if not trainable:
        ds.pop("gradient_clipping")
    return ds


def make_optimizer(params, t, offload: bool) -> torch.optim.Optimizer:
    """AdamW; with ZeRO-Offload, DeepSpeed's CPU AdamW (the same update, run on the CPU copy of
    the optimizer state; its C++ op is compiled on first use)."""
    kwargs = dict(lr=t.lr, betas=(t.adam_beta1, t.adam_beta2), weight_decay=t.weight_decay, eps=1e-8)
    if offload:
        from deepspeed.ops.adam import DeepSpeedCPUAdam

        return DeepSpeedCPUAdam(params, adamw_mode=True, **kwargs)
    return torch.optim.AdamW(params, **kwargs)


class Engine:
    """A model under DeepSpeed, with or without an optimizer (frozen models: trainable=False)."""

    def __init__(self, cfg, model: torch.nn.Module, trainable: bool = True):
        import deepspeed

        self.cfg = cfg
        self.info = dist.info()
        self.trainable = trainable
        if cfg.engine.activation_checkpointing and hasattr(model, "gradient_checkpointing_enable"):
            model.gradient_checkpointing_enable()
        ds_cfg = deepspeed_config(cfg, trainable)
        if trainable:
            t = cfg.train
            params = [p for p in model.parameters() if p.requires_grad]
            optimizer = make_optimizer(params, t, offload=cfg.engine.offload_optimizer and cfg.engine.zero_stage > 0)
            scheduler = make_scheduler(optimizer, t)
            self.ds, self.optimizer, _, self.scheduler = deepspeed.initialize(
                model=model, optimizer=optimizer, lr_scheduler=scheduler, config=ds_cfg)
        elif cfg.engine.zero_stage == 3:
            # a frozen model under ZeRO-3 is partitioned like the policy (e.g. the reference)
            model.requires_grad_(False)
            self.ds, *_ = deepspeed.initialize(model=model, config=ds_cfg)
            self.optimizer = self.scheduler = None
        else:
            # stages 0-2 shard only training state: a frozen model is a plain replicated module
            model.requires_grad_(False)
            dtype = torch.bfloat16 if cfg.engine.precision == "bf16" else None
            self.ds = model.to(device=self.info.device, dtype=dtype)
            self.optimizer = self.scheduler = None
        self.ds.train(trainable)

    # ------------------------------------------------------------------ training
    @property
    def module(self) -> torch.nn.Module:
        return getattr(self.ds, "module", self.ds)

    @property
    def device(self) -> torch.device:
        return self.info.device

    def __call__(self, *args, **kwargs):
        return self.ds(*args, **kwargs)

    def backward(self, loss: torch.Tensor) -> None:
        """Backward of a micro-batch loss already normalised by the global item count."""
        self.ds.backward(loss * self.info.world_size, scale_wrt_gas=False)

    def step(self) -> None:
        """Call after every micro-batch; DeepSpeed updates at the accumulation boundary."""
        self.ds.step()

    @property
    def global_step(self) -> int:
        return int(self.ds.global_steps)

    def lr(self) -> float:
        return float(self.scheduler.get_last_lr()[0]) if self.scheduler else 0.0

    def grad_norm(self) -> float | None:
        """Global gradient norm before clipping, when DeepSpeed tracked it (ZeRO 1-3, bf16)."""
        norm = self.ds.get_global_grad_norm()
        return float(norm) if norm is not None else None

    @contextlib.contextmanager
    def evaluating(self):
        """Eval mode (no dropout) and no gradient for the duration, then back to training mode."""
        self.ds.eval()
        try:
            with torch.no_grad():
                yield self
        finally:
            self.ds.train(self.trainable)

    # ------------------------------------------------------------------ generation
    @contextlib.contextmanager
    def gathered(self):
        """Full parameters on every rank for the duration (ZeRO-3); a no-op otherwise.

        Generation runs many forwards; gathering once per phase avoids one all-gather per
        layer per token."""
        if self.cfg.engine.zero_stage != 3:
            yield self.module
            return
        import deepspeed

        params = list(self.module.parameters())
        with deepspeed.zero.GatheredParameters(params, modifier_rank=None):
            yield self.module

    def named_weights(self):
        """(checkpoint name, full tensor) for every parameter, one at a time (a rollout engine's
        weight sync); a tied parameter comes under each of its names, as in a checkpoint. Under
        ZeRO-3 each parameter is gathered, handed out as a copy and released before the next, so
        at most one gathered parameter exists beside the shards."""
        if self.cfg.engine.zero_stage != 3:
            for name, p in self.module.named_parameters(remove_duplicate=False):
                yield name, p.detach()
            return
        import deepspeed

        for name, p in self.module.named_parameters(remove_duplicate=False):
            with deepspeed.zero.GatheredParameters([p], modifier_rank=None):
                full = p.detach().clone()
            yield name, full

    # ------------------------------------------------------------------ checkpoints
    def save_checkpoint(self, ckpt_root: Path, step: int, client_state: dict, keep: int,
                        companions: dict[str, "Engine"] | None = None) -> Path:
        """Resumable state (weights, optimizer, scheduler, client_state) to ckpt_root/step-N, atomically.

        `companions` (e.g. PPO's critic) are saved in the same checkpoint, under <name>/, before
        the rename, so a checkpoint either holds every engine or does not exist."""
        final = ckpt_root / f"step-{step:07d}"
        tmp = ckpt_root / f".tmp-step-{step:07d}"
        if self.info.is_main:
            shutil.rmtree(tmp, ignore_errors=True)
            tmp.mkdir(parents=True)
        dist.barrier()
        self.ds.save_checkpoint(str(tmp), tag="state", client_state=client_state, save_latest=False)
        for name, engine in (companions or {}).items():
            engine.ds.save_checkpoint(str(tmp / name), tag="state", client_state={}, save_latest=False)
        dist.barrier()
        if self.info.is_main:
            shutil.rmtree(final, ignore_errors=True)
            os.replace(tmp, final)
            for old in list_checkpoints(ckpt_root)[:-keep] if keep > 0 else []:
                shutil.rmtree(old, ignore_errors=True)
        dist.barrier()
        return final

    def load_checkpoint(self, path: Path, companions: dict[str, "Engine"] | None = None) -> dict:
        """Restore a checkpoint written by save_checkpoint (and its companions); returns its client_state."""
        _, client_state = self.ds.load_checkpoint(str(path), tag="state", load_optimizer_states=True,
                                                  load_lr_scheduler_states=True)
        for name, engine in (companions or {}).items():
            if not (Path(path) / name).is_dir():
                raise RuntimeError(f"checkpoint {path} has no {name}/ state; it was written without the {name}")
            engine.ds.load_checkpoint(str(Path(path) / name), tag="state", load_optimizer_states=True,
                                      load_lr_scheduler_states=True)
        return client_state or {}

    def full_state_dict(self) -> dict | None:
        """The complete weights on rank 0 (None on other ranks); collective under ZeRO-3."""
        if self.cfg.engine.zero_stage == 3:
            return self.ds._zero3_consolidated_16bit_state_dict()
        if not self.info.is_main:
            return None
        return {k: v.detach().cpu() for k, v in self.module.state_dict().items()}

    def export_hf(self, out_dir: Path, tokenizer, manifest_writer=None) -> None:
        """Write a Hugging Face model directory (weights, config, tokenizer) atomically.

        Collective: every rank must call it. Only rank 0 writes."""
        state = self.full_state_dict()
        if self.info.is_main:
            save_hf_dir(self.module, state, tokenizer, Path(out_dir))
        dist.barrier()


def save_hf_dir(model, state_dict, tokenizer, out_dir: Path) -> None:
    """save_pretrained into a temporary sibling, then rename over out_dir."""
    out_dir = Path(out_dir)
    tmp = out_dir.parent / f".tmp-{out_dir.name}-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    model.save_pretrained(tmp, state_dict=state_dict, safe_serialization=True)
    tokenizer.save_pretrained(tmp)
    replace_dir(tmp, out_dir)


def replace_dir(src: Path, dst: Path) -> None:
    """Move src to dst; an existing dst is swapped out first so dst is never half-written."""
    old = dst.parent / f".old-{dst.name}-{os.getpid()}"
    if dst.exists():
        os.replace(dst, old)
    os.replace(src, dst)
    shutil.rmtree(old, ignore_errors=True)


def list_checkpoints(ckpt_root: Path) -> list[Path]:
    """Completed resumable checkpoints, oldest first."""
    if not ckpt_root.is_dir():
        return []
    return sorted(p for p in ckpt_root.iterdir() if p.is_dir() and p.name.startswith("step-"))
