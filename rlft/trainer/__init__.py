"""The trainer: the only place that imports deepspeed.

`Trainer` wraps a DeepSpeed engine (ZeRO 0-3, fp32/bf16, gradient accumulation, clipping,
warm-up + decay schedule) and adds what the stages need around it: saving and loading the DeepSpeed
state of a resumable checkpoint (its folder, checksums and the rest are rlft/files), the full weights
for a Hugging Face export (gathered under ZeRO-3), and a context that gathers ZeRO-3 parameters once for
a whole generation phase.

Loss scaling contract: a stage computes, per micro-batch, `sum of per-item losses / global
count of items in the optimizer step` (see rlft.algos aggregation) and calls `backward`.
DeepSpeed averages gradients over ranks, so `backward` multiplies by the world size and
does not divide by the accumulation steps: the optimizer then sees exactly the gradient of
the full-batch loss, whatever the micro-batch size or number of ranks.
"""
from __future__ import annotations

import contextlib
from pathlib import Path

import torch

from rlft import dist, lora
from rlft.config.arithmetic import grad_accum_steps
from rlft.errors import NonFiniteError
from rlft.files import checkpoints
from rlft.files.handoff import save_adapter_dir, save_hf_dir
from rlft.files.integrity import raise_if_disk_full


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


def last_step_lr(scheduler: torch.optim.lr_scheduler.LambdaLR) -> float:
    """The rate the last optimizer step used. The scheduler has already moved on to the next step's
    (get_last_lr), which after the final step of a constant schedule is the decay floor."""
    return float(scheduler.base_lrs[0] * scheduler.lr_lambdas[0](max(scheduler.last_epoch - 1, 0)))


def bucket_elements(cfg, hidden_size: int | None) -> int:
    """ZeRO's communication bucket size in elements: deepspeed.bucket_elements, else hidden_size² (at least
    2^20; transformers' 'auto'), so the reduce buffer of a small model is small and of a large one is few
    collectives. See docs/performance.md (memory)."""
    if cfg.deepspeed.bucket_elements:
        return int(cfg.deepspeed.bucket_elements)
    return max(int(hidden_size or 0) ** 2, 2**20)


def deepspeed_config(cfg, trainable: bool = True, hidden_size: int | None = None) -> dict:
    train, ds_opts = cfg.train, cfg.deepspeed
    ds = {
        "train_batch_size": train.batch_size,
        "train_micro_batch_size_per_gpu": train.micro_batch_per_device,
        "gradient_accumulation_steps": grad_accum_steps(cfg),
        "gradient_clipping": float(train.grad_clip),
        "zero_optimization": {"stage": ds_opts.zero_stage},
        "bf16": {"enabled": ds_opts.precision == "bf16"},
        "fp16": {"enabled": False},
        "zero_allow_untested_optimizer": True,
        "steps_per_print": 10**9,
        "wall_clock_breakdown": False,
    }
    if ds_opts.offload_optimizer and ds_opts.zero_stage > 0:
        ds["zero_optimization"]["offload_optimizer"] = {"device": "cpu"}
    bucket = bucket_elements(cfg, hidden_size)
    if ds_opts.zero_stage >= 2:
        ds["zero_optimization"].update(reduce_bucket_size=bucket, allgather_bucket_size=bucket)
    if ds_opts.zero_stage == 3:
        ds["zero_optimization"]["stage3_gather_16bit_weights_on_model_save"] = True
        if ds_opts.zero3_sub_group_elements:
            ds["zero_optimization"]["sub_group_size"] = int(ds_opts.zero3_sub_group_elements)
        if ds_opts.zero3_live_parameters:
            ds["zero_optimization"].update(stage3_max_live_parameters=int(ds_opts.zero3_live_parameters),
                                           stage3_max_reuse_distance=int(ds_opts.zero3_live_parameters))
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


class Trainer:
    """A model under DeepSpeed, with or without an optimizer (frozen models: trainable=False)."""

    def __init__(self, cfg, model: torch.nn.Module, trainable: bool = True):
        import deepspeed

        self.cfg = cfg
        self.info = dist.info()
        self.trainable = trainable
        if trainable and lora.enabled(cfg.model):
            model = lora.add_adapter(model, cfg.model.lora)
        if cfg.deepspeed.activation_checkpointing and hasattr(model, "gradient_checkpointing_enable"):
            model.gradient_checkpointing_enable()
        ds_cfg = deepspeed_config(cfg, trainable, getattr(getattr(model, "config", None), "hidden_size", None))
        if trainable:
            train = cfg.train
            params = [p for p in model.parameters() if p.requires_grad]
            optimizer = make_optimizer(params, train,
                                       offload=cfg.deepspeed.offload_optimizer and cfg.deepspeed.zero_stage > 0)
            scheduler = make_scheduler(optimizer, train)
            self.ds, self.optimizer, _, self.scheduler = deepspeed.initialize(
                model=model, optimizer=optimizer, lr_scheduler=scheduler, config=ds_cfg)
        elif cfg.deepspeed.zero_stage == 3:
            # a frozen model under ZeRO-3 is partitioned like the policy (e.g. the reference)
            model.requires_grad_(False)
            self.ds, *_ = deepspeed.initialize(model=model, config=ds_cfg)
            self.optimizer = self.scheduler = None
        else:
            # stages 0-2 shard only training state: a frozen model is a plain replicated module
            model.requires_grad_(False)
            dtype = torch.bfloat16 if cfg.deepspeed.precision == "bf16" else None
            self.ds = model.to(device=self.info.device, dtype=dtype)
            self.optimizer = self.scheduler = None
        self.ds.train(trainable)
        self.dropped_micro_batches = 0  # micro-batches of the current optimizer step with a non-finite loss
        self.backwards_in_step = 0
        self.nonfinite_steps_in_a_row = 0

    # ------------------------------------------------------------------ training
    @property
    def module(self) -> torch.nn.Module:
        return getattr(self.ds, "module", self.ds)

    @property
    def device(self) -> torch.device:
        return self.info.device

    def __call__(self, *args, **kwargs):
        return self.ds(*args, **kwargs)

    def backward(self, loss: torch.Tensor, last: bool) -> None:
        """Backward of a micro-batch loss already normalised by the global item count; `last`: the
        optimizer step's final micro-batch, where DeepSpeed reduces the gradients and `step` updates
        (marked here, so a step may have any number of micro-batches: train.max_tokens_per_micro_batch).

        A non-finite loss on any rank makes every rank drop this micro-batch (no backward, so the
        ranks' collectives stay matched and no NaN reaches the gradients); `step` then applies
        train.on_nonfinite."""
        self.ds.set_gradient_accumulation_boundary(bool(last))
        bad = float(not bool(torch.isfinite(loss.detach()).all()))
        if self.info.world_size > 1:
            bad = dist.all_reduce_max([bad])[0]
        if bad:
            self.dropped_micro_batches += 1
            return
        self.ds.backward(loss * self.info.world_size, scale_wrt_gas=False)
        self.backwards_in_step += 1

    def step(self) -> None:
        """Call after every micro-batch; DeepSpeed updates at the accumulation boundary. There the
        non-finite policy is applied first: NonFiniteError stops before the update."""
        if self.ds.is_gradient_accumulation_boundary():
            self.check_finite()
        self.ds.step()

    def check_finite(self) -> None:
        """Before an optimizer update: stop when micro-batches were dropped and train.on_nonfinite=stop,
        when every micro-batch of the step was dropped, or after train.max_nonfinite_steps such steps in
        a row; else report the dropped ones. (A non-finite gradient from finite losses shows as
        non-finite weights, which are never saved: see save_checkpoint and export_hf.)"""
        train, step = self.cfg.train, self.global_step + 1
        dropped, used = self.dropped_micro_batches, self.backwards_in_step
        self.dropped_micro_batches = self.backwards_in_step = 0
        if not dropped:
            self.nonfinite_steps_in_a_row = 0
            return
        self.nonfinite_steps_in_a_row += 1
        if train.on_nonfinite == "stop" or not used or self.nonfinite_steps_in_a_row > train.max_nonfinite_steps:
            why = ("" if train.on_nonfinite == "stop" else
                   " (every micro-batch of the step)" if not used else f" ({self.nonfinite_steps_in_a_row} steps in a row)")
            raise NonFiniteError(f"non-finite loss (NaN or inf) at optimizer step {step}: {dropped} micro-batch(es)"
                                 f"{why}; stopped before the update and nothing of this step saved (resume=true restarts "
                                 "from the last checkpoint, if one was written); lower train.lr or check the data")
        dist.print0(f"[rlft] optimizer step {step}: dropped {dropped} micro-batch(es) with a non-finite loss "
                    f"(train.on_nonfinite=drop, {self.nonfinite_steps_in_a_row} step(s) in a row)")

    @property
    def global_step(self) -> int:
        return int(self.ds.global_steps)

    def lr(self) -> float:
        return last_step_lr(self.scheduler) if self.scheduler else 0.0

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
        if self.cfg.deepspeed.zero_stage != 3:
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
        at most one gathered parameter (with LoRA: one layer's base, A and B) exists beside the shards."""
        if self.has_adapter:
            yield from lora.merged_weights(self.module, self.module.named_parameters(remove_duplicate=False),
                                           self._gathered, copy_whole=self.cfg.deepspeed.zero_stage == 3)
            return
        if self.cfg.deepspeed.zero_stage != 3:
            for name, p in self.module.named_parameters(remove_duplicate=False):
                yield name, p.detach()
            return
        for name, p in self.module.named_parameters(remove_duplicate=False):
            with self._gathered([p]):
                full = p.detach().clone()
            yield name, full

    def _gathered(self, params):
        """The parameters whole for the duration (ZeRO-3 gathers them; other stages hold them whole)."""
        if self.cfg.deepspeed.zero_stage != 3:
            return contextlib.nullcontext()
        import deepspeed

        return deepspeed.zero.GatheredParameters(params, modifier_rank=None)

    def state_bytes(self) -> int:
        """Bytes of this trainer's resumable state on all ranks, roughly: fp32 weights and, when it trains,
        Adam's two fp32 moments (and bf16 copies); a LoRA run's checkpoints hold only what trains."""
        params = [p for p in self.module.parameters() if p.requires_grad or not self.has_adapter]
        numel = sum(getattr(p, "ds_numel", p.numel()) for p in params)
        return numel * ((4 + 8 + (2 if self.cfg.deepspeed.precision == "bf16" else 0)) if self.trainable else 4)

    def weights_finite(self) -> bool:
        """Whether every weight on every rank is finite (collective; each rank checks its own shard)."""
        bad = 0.0
        for p in self.module.parameters():
            local = getattr(p, "ds_tensor", p)  # ZeRO-3: this rank's partition
            if local.numel() and not bool(torch.isfinite(local.detach()).all()):
                bad = 1.0
                break
        return dist.all_reduce_max([bad])[0] == 0.0

    # ------------------------------------------------------------------ checkpoints
    def save_checkpoint(self, ckpt_root: Path, step: int, client_state: dict, keep: int,
                        companions: dict[str, "Trainer"] | None = None) -> Path:
        """Resumable state (weights, optimizer, scheduler, client_state) to ckpt_root/step-N, atomically
        (rlft/files/checkpoints.py: the temporary folder, the config, checksums, the rename and pruning).

        `companions` (e.g. PPO's critic) are saved in the same checkpoint, under <name>/, before
        the rename, so a checkpoint either holds every trainer or does not exist."""
        if not self.weights_finite():
            kept = checkpoints.list_checkpoints(ckpt_root)
            raise NonFiniteError(f"the weights are not finite (NaN or inf) at step {step}; no checkpoint written"
                                 + (f", the last good one is {kept[-1]}" if kept else "")
                                 + "; lower train.lr or check the data")
        trainers = [self, *(companions or {}).values()]
        tmp = checkpoints.start_checkpoint(ckpt_root, step, sum(t.state_bytes() for t in trainers))
        try:
            # a LoRA run saves only what trains (the adapter, a reward head): the frozen base comes from model.path
            self.ds.save_checkpoint(str(tmp), tag="state", client_state=client_state, save_latest=False,
                                    exclude_frozen_parameters=self.has_adapter)
            for name, companion in (companions or {}).items():
                companion.ds.save_checkpoint(str(tmp / name), tag="state", client_state={}, save_latest=False,
                                             exclude_frozen_parameters=companion.has_adapter)
        except (OSError, RuntimeError) as exc:
            raise_if_disk_full(exc, tmp, f"checkpoint step-{step:07d}")
            raise
        dist.barrier()
        final = checkpoints.commit_checkpoint(tmp, step, self.cfg, keep) if self.info.is_main else None
        dist.barrier()
        return final or checkpoints.step_dir(ckpt_root, step)

    def load_checkpoint(self, path: Path, companions: dict[str, "Trainer"] | None = None) -> dict:
        """Restore a checkpoint written by save_checkpoint (and its companions); returns its client_state."""
        _, client_state = self.ds.load_checkpoint(str(path), tag="state", load_optimizer_states=True,
                                                  load_lr_scheduler_states=True, load_module_strict=not self.has_adapter)
        for name, companion in (companions or {}).items():
            if not (Path(path) / name).is_dir():
                raise RuntimeError(f"checkpoint {path} has no {name}/ state; it was written without the {name}")
            companion.ds.load_checkpoint(str(Path(path) / name), tag="state", load_optimizer_states=True,
                                         load_lr_scheduler_states=True, load_module_strict=not companion.has_adapter)
        return client_state or {}

    def full_state_dict(self) -> dict | None:
        """The complete weights on rank 0 (None on other ranks), with a LoRA adapter's tensors as they are;
        collective under ZeRO-3."""
        if self.cfg.deepspeed.zero_stage == 3:
            return self.ds._zero3_consolidated_16bit_state_dict()
        if not self.info.is_main:
            return None
        return {k: v.detach().cpu() for k, v in self.module.state_dict().items()}

    @property
    def has_adapter(self) -> bool:
        return lora.has_adapter(self.module)

    @contextlib.contextmanager
    def adapter_disabled(self):
        """The base model (LoRA adapter off) for the duration."""
        with lora.adapter_disabled(self.module):
            yield self

    def export_hf(self, out_dir: Path, tokenizer, manifest_writer=None) -> None:
        """Write a Hugging Face model directory (weights, config, tokenizer) atomically.

        Collective: every rank must call it. Only rank 0 writes; nothing is written when a weight is
        not finite (NonFiniteError on every rank)."""
        state = self.full_state_dict()
        bad = 0.0
        if self.info.is_main:  # the adapter's tensors too: a merged weight is finite when its parts are
            bad = float(not all(bool(torch.isfinite(v).all()) for v in state.values() if v.is_floating_point()))
        if dist.all_reduce_max([bad])[0]:
            raise NonFiniteError(f"the trained weights are not finite (NaN or inf); {out_dir} was not written; "
                                 "lower train.lr or check the data")
        if self.info.is_main:
            if self.has_adapter:  # final/ is the plain model, peft's adapter folder goes beside it
                state = lora.dequantized_state_dict(self.module, state)  # QLoRA: the base in the model's precision
                wrapped = lora.peft_copy(self.module, state)
                save_adapter_dir(wrapped, Path(out_dir).with_name(Path(out_dir).name + "-adapter"))
                state = wrapped.merge_and_unload().state_dict()
            save_hf_dir(self.module, state, tokenizer, Path(out_dir))
        dist.barrier()
