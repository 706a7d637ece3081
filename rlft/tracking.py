"""Metrics to the console (with rate and ETA), to metrics.jsonl and to wandb, from rank 0."""
from __future__ import annotations

import json
import math
import os
import sys
import time
from pathlib import Path


def wandb_mode(setting: str) -> str:
    """auto -> online with an API key, offline without one; WANDB_MODE in the environment wins."""
    if os.environ.get("WANDB_MODE"):
        return os.environ["WANDB_MODE"]
    if setting == "auto":
        return "online" if os.environ.get("WANDB_API_KEY") else "offline"
    return setting


def wandb_reachable(timeout_s: float = 3.0) -> bool:
    """Whether wandb's server (WANDB_BASE_URL, default https://api.wandb.ai) answers an HTTP request
    within timeout_s (any status counts); without this check a run with a key and no network waits
    about 100 s inside wandb before it goes offline."""
    import urllib.error
    import urllib.request

    url = os.environ.get("WANDB_BASE_URL", "https://api.wandb.ai")
    try:
        urllib.request.urlopen(urllib.request.Request(url, method="HEAD"), timeout=timeout_s).close()
    except urllib.error.HTTPError:
        return True
    except (OSError, ValueError):
        return False
    return True


def format_duration(seconds: float) -> str:
    if not math.isfinite(seconds):
        return "?"
    seconds = int(round(seconds))
    h, rem = divmod(seconds, 3600)
    m, s = divmod(rem, 60)
    return f"{h}:{m:02d}:{s:02d}" if h else f"{m:02d}:{s:02d}"


def format_value(v) -> str:
    if isinstance(v, float):
        return f"{v:.4g}"
    return str(v)


class Tracker:
    """One per stage. Only the main rank writes; other ranks get a silent tracker."""

    def __init__(self, run_dir: Path, cfg, is_main: bool, total_steps: int, start_step: int = 0):
        self.is_main = is_main
        self.total_steps = total_steps
        self.start_step = start_step
        self.t0 = time.time()
        self.path = Path(run_dir) / "metrics.jsonl"
        self._wandb = None
        self._bar = None
        if not is_main:
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        if start_step == 0 and self.path.exists():
            self.path.unlink()
        elif start_step > 0:
            self._truncate_after(start_step)
        if cfg.logger.progress:
            from tqdm import tqdm

            self._bar = tqdm(total=total_steps, initial=start_step, desc=cfg.algo.name, unit="step",
                             file=sys.stderr, dynamic_ncols=True, mininterval=1.0)
        mode = wandb_mode(cfg.logger.wandb)
        if mode == "online" and not wandb_reachable():
            print("[rlft] wandb's server is not reachable within 3 s: logging offline (wandb sync uploads it later)",
                  file=sys.stderr)
            mode = "offline"
        if mode != "disabled":
            try:
                import wandb
                from omegaconf import OmegaConf

                self._wandb = wandb.init(project=cfg.logger.project, name=f"{cfg.run.name}/{cfg.algo.name}",
                                         dir=str(run_dir), mode=mode, resume="allow",
                                         config=OmegaConf.to_container(cfg, resolve=True))
            except Exception as exc:  # a tracker must never stop training
                print(f"wandb unavailable ({exc}); logging to metrics.jsonl only", file=sys.stderr)

    def _truncate_after(self, step: int) -> None:
        """On resume, drop lines logged after the checkpoint so metrics.jsonl has no duplicates."""
        if not self.path.exists():
            return
        keep = [line for line in self.path.read_text().splitlines()
                if line.strip() and json.loads(line).get("step", 0) <= step]
        self.path.write_text("".join(line + "\n" for line in keep))

    def rate_and_eta(self, step: int) -> tuple[float, float]:
        done = step - self.start_step
        elapsed = time.time() - self.t0
        rate = done / elapsed if elapsed > 0 and done > 0 else float("nan")
        eta = (self.total_steps - step) / rate if rate and rate > 0 else float("nan")
        return rate, eta

    def advance(self, n: int = 1) -> None:
        if self._bar is not None:
            self._bar.update(n)

    def log(self, step: int, metrics: dict) -> None:
        if not self.is_main:
            return
        rate, eta = self.rate_and_eta(step)
        record = {"step": step, **{k: v for k, v in metrics.items()}, "time_s": round(time.time() - self.t0, 3)}
        with self.path.open("a") as f:
            f.write(json.dumps(record, default=float) + "\n")
        if self._wandb is not None:
            self._wandb.log(metrics, step=step)
        shown = " | ".join(f"{k} {format_value(v)}" for k, v in metrics.items())
        line = (f"step {step}/{self.total_steps} | {shown} | {rate:.2f} step/s | ETA {format_duration(eta)}")
        if self._bar is not None:
            self._bar.write(line, file=sys.stderr)
        else:
            print(line, flush=True)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
        if self._wandb is not None:
            self._wandb.finish()
