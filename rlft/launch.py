"""The driver: compose once, write the resolved config, then train in-process or start ranks.

One rank (deepspeed.nproc_per_node=1, deepspeed.nnodes=1) trains inside the driver process; more
ranks are started with torch.distributed.run (rlft.rank_launcher), each running `python -m rlft.worker CONFIG`.
Multi-node runs start one driver per machine with the same overrides plus its
deepspeed.node_rank (see README, 'Multi-node'). Hydra never sees the rank arguments, which is
what keeps `-m` sweeps and the DeepSpeed launcher from tripping over each other.
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

from omegaconf import OmegaConf

from rlft import signals
from rlft.config.algorithms import algo_spec
from rlft.config.arithmetic import grad_accum_steps, trains_critic
from rlft.errors import LaunchError, RankUserError
from rlft.files import handoff, rundir
from rlft.files.integrity import write_text_atomic
from rlft.model_source import resolve_model_path


def job_dir(cfg) -> Path:
    """This job's stage directory; under -m every job gets its own (<sweep dir>/<job num>/<algo>)."""
    if cfg.run.dir:
        return Path(cfg.run.dir)
    try:
        from hydra.core.hydra_config import HydraConfig
        from hydra.types import RunMode

        hc = HydraConfig.get()
        if hc.mode == RunMode.MULTIRUN:
            return Path(hc.sweep.dir) / str(hc.sweep.subdir) / cfg.algo.name
    except ValueError:  # not running under Hydra (tests, library use)
        pass
    return handoff.stage_dir(cfg)


def resolved(cfg):
    """A plain, fully resolved copy of the config with run.dir filled in."""
    plain = OmegaConf.create(OmegaConf.to_container(cfg, resolve=True))
    plain.run.dir = str(job_dir(cfg))
    return plain


def batch_arithmetic(cfg) -> str:
    world = cfg.deepspeed.nproc_per_node * cfg.deepspeed.nnodes
    return (f"batch: {cfg.train.batch_size} sequences per optimizer step = {cfg.train.micro_batch_per_device} "
            f"per micro-batch x {world} rank(s) x {grad_accum_steps(cfg)} accumulation step(s); "
            f"up to {cfg.train.batch_size * cfg.train.max_seq_len} tokens per step; "
            f"{cfg.train.max_steps} steps")


def write_config(cfg, path: Path) -> None:
    write_text_atomic(path, OmegaConf.to_yaml(cfg))


def preflight(cfg) -> None:
    """What can be checked before any rank starts and before anything of the stage is removed:
    input models (intact, complete), reward sources (user functions imported), the data (loaded
    and mapped, so a bad row is named in seconds). One-line errors."""
    parent = resolve_model_path(cfg)
    from rlft import envs
    from rlft.algos import ADVANTAGES
    from rlft.data.loading import DataError
    from rlft.rewards.scoring import check_sources
    from rlft.stages import inputs

    algo, spec = cfg.algo, algo_spec(cfg.algo)
    functions = list(cfg.reward.functions) if spec.samples else []
    if trains_critic(cfg):
        resolve_model_path(cfg, cfg.critic.init)
    if "rm" in functions:
        resolve_model_path(cfg, cfg.reward.rm_path)
    if "prm" in functions or (spec.rl and ADVANTAGES.needs(algo.advantage, "step_scores")
                              and cfg.reward.process == "prm"):
        resolve_model_path(cfg, cfg.reward.prm_path)
    if spec.samples:
        check_sources(cfg)  # imports first: a broken module is one line before the data is built
    if getattr(algo, "source", None) == "policy":
        resolve_model_path(cfg, algo.sample_from)
    policy_samples = getattr(algo, "source", None) == "policy"  # a reward model labels samples of its questions
    if spec.samples or policy_samples or spec.rows == "qa":  # the environment's rows, checked where it judges them
        tokenizer = None
        if spec.demonstrations or spec.samples:  # the environment meets the policy's tokenizer (its tool-call
            from rlft.models import load_tokenizer  # format, the demonstrations' encoding) before any rank starts

            tokenizer = load_tokenizer(cfg.model, parent)
        env = envs.build(cfg, tokenizer)
        if spec.samples or policy_samples:  # what the environment runs under (a sandbox refused here, not in a rank)
            line = env.describe()
            if line:
                print(f"[rlft] {line}", flush=True)
        rows = env.rows("train")
        if not rows:
            raise DataError(f"environment {cfg.env.name}: the training split has no rows")
        if "correctness" in functions or policy_samples:
            env.check_rows(rows, f"{cfg.data.source} [train]")
        if spec.samples:
            check_sources(cfg, rows[0])
        if spec.demonstrations:
            inputs.check_demonstrations_fit(cfg, tokenizer, rows)
    else:
        inputs.rows_of(cfg, spec.rows, "train")


def quiet_environment() -> None:
    """Settings that keep the console to rlft's own lines: DeepSpeed's accelerator on a machine
    without a GPU (else it warns on every import, in every rank), wandb without its banners."""
    import torch

    if "DS_ACCELERATOR" not in os.environ and not torch.cuda.is_available():
        os.environ["DS_ACCELERATOR"] = "cpu"
    os.environ.setdefault("WANDB_SILENT", "true")


def launch_train(cfg, header: list[str] | tuple = ()) -> None:
    """Train one stage. `header`: lines for the run header (where the rates and sizes came from)."""
    cfg = resolved(cfg)
    quiet_environment()
    preflight(cfg)
    run_dir = Path(cfg.run.dir)
    if cfg.deepspeed.node_rank != 0:  # node 0's driver holds the stage's lock
        run_ranks(cfg, run_dir, header)
        return
    with rundir.stage_lock(run_dir):
        rundir.check_not_completed(run_dir, cfg.resume, cfg.overwrite)
        for path in rundir.remove_temporaries(run_dir):
            print(f"[rlft] removed {path}, left by an interrupted writer", flush=True)
        write_config(cfg, run_dir / "config.yaml")
        run_ranks(cfg, run_dir, header)


def run_ranks(cfg, run_dir: Path, header: list[str] | tuple = ()) -> None:
    ds_opts, train = cfg.deepspeed, cfg.train
    print(f"[rlft] {cfg.algo.name} -> {run_dir}", flush=True)
    for line in header:
        print(f"[rlft] {line}", flush=True)
    print(f"[rlft] {batch_arithmetic(cfg)}", flush=True)
    if train.packing and cfg.model.attn_implementation not in ("flash_attention_2", "flash_attention_3"):
        print(f"[rlft] note: train.packing with model.attn_implementation={cfg.model.attn_implementation} attends over "
              "each whole packed row under a block-diagonal mask, which costs more than it saves on short sequences; "
              "packing pays with model.attn_implementation=flash_attention_2 (GPU)", flush=True)
    if train.warmup_steps >= train.max_steps:
        print(f"[rlft] note: train.warmup_steps={train.warmup_steps} is not below train.max_steps={train.max_steps}: "
              f"the learning rate reaches train.lr={train.lr:g} only at the last step (lower train.warmup_steps)",
              flush=True)
    if ds_opts.nproc_per_node * ds_opts.nnodes == 1:
        from rlft.worker import run_stage

        signals.install()  # SIGINT/SIGTERM: checkpoint after the current step, then a one-line stop
        run_stage(cfg)
        return
    with tempfile.TemporaryDirectory(prefix="rlft-launch-") as tmp:
        cfg_path = Path(tmp) / "config.yaml"
        write_config(cfg, cfg_path)
        cmd = rank_command(cfg, cfg_path)
        error_file = Path(tmp) / "error.txt"
        # OMP_NUM_THREADS=1 is torch.distributed.run's own default (each rank sets its torch threads from
        # deepspeed.threads_per_rank); set here, the launcher does not print a banner about it
        env = {"OMP_NUM_THREADS": "1", **os.environ, "PYTHONUNBUFFERED": "1", "RLFT_ERROR_FILE": str(error_file)}
        code = run_launcher(cmd, env)
        user_error = error_file.read_text() if error_file.exists() else None
    if user_error:
        raise RankUserError(user_error)
    if code != 0:
        raise LaunchError(f"training ranks {exit_reason(code)} (command: {' '.join(cmd)}); see the log above")


def exit_reason(code: int) -> str:
    """'exited with code N' or 'were killed by SIGNAME'."""
    if code < 0:
        return f"were killed by {signal.Signals(-code).name}"
    return f"exited with code {code}"


def children(pid: int) -> list[int]:
    """The direct child processes of `pid` (Linux /proc; [] where it cannot tell)."""
    try:
        return [int(c) for c in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except (OSError, ValueError):
        return []


def run_launcher(cmd: list[str], env: dict) -> int:
    """Run the rank launcher in its own session (a terminal's Ctrl-C reaches only this driver) with
    the kernel told to SIGTERM it if the driver dies; SIGINT/SIGTERM to the driver are forwarded as
    one SIGTERM (the ranks then checkpoint and stop), and the driver waits for it."""
    proc = subprocess.Popen(cmd, env=env, start_new_session=True, preexec_fn=signals.die_with_parent)
    forwarded = []

    def forward(signum, frame):
        if not forwarded:  # to the ranks themselves (the launcher would answer with a traceback)
            forwarded.append(signum)
            for pid in children(proc.pid) or [proc.pid]:
                os.kill(pid, signal.SIGTERM)
        else:  # a second signal: stop the ranks now
            proc.kill()

    previous = {sig: signal.signal(sig, forward) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        return proc.wait()
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def rank_command(cfg, cfg_path: Path) -> list[str]:
    ds_opts = cfg.deepspeed
    port = ds_opts.master_port
    if port == 0:
        from rlft.dist import free_port

        port = free_port()
    return [sys.executable, "-m", "rlft.rank_launcher", f"--nproc_per_node={ds_opts.nproc_per_node}",
            f"--nnodes={ds_opts.nnodes}", f"--node_rank={ds_opts.node_rank}", f"--master_addr={ds_opts.master_addr}",
            f"--master_port={port}", "-m", "rlft.worker", str(cfg_path)]
