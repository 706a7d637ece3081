"""One training rank: `python -m rlft.worker RESOLVED_CONFIG.yaml` (started by rlft.launch)."""
from __future__ import annotations

import os
import sys
from pathlib import Path

from omegaconf import OmegaConf


def run_stage(cfg) -> dict:
    """Join the process group and run the configured stage on this rank."""
    from rlft import dist
    from rlft.stages import run_stage_function
    from rlft.stages.common import StageContext

    info = dist.init(cfg.deepspeed)
    ctx = StageContext(cfg=cfg, info=info, run_dir=Path(cfg.run.dir))
    return run_stage_function(cfg, ctx)


def main(argv: list[str]) -> None:
    # the DeepSpeed launcher appends --local_rank=N; the rank comes from the environment anyway
    argv = [a for a in argv if not a.startswith("--local_rank")]
    if len(argv) != 1:
        raise SystemExit("usage: python -m rlft.worker RESOLVED_CONFIG.yaml")
    from rlft import dist, signals
    from rlft.errors import USER_ERRORS, Interrupted, debugging

    signals.die_with_parent()  # the launcher's death (however it died) stops this rank
    signals.install()

    try:
        run_stage(OmegaConf.load(argv[0]))
        # a rank process ends here: leave the group together (the in-process single rank keeps it
        # for the next job of a sweep)
        dist.shutdown()
        exit_now(0)
    except USER_ERRORS as exc:
        if debugging():
            import traceback

            traceback.print_exc()
        report(exc)
        # every rank stops on a signal together (they agree on it), so they all exit 0 and the launcher
        # stays quiet; any other error exits non-zero so that the launcher stops the other ranks
        raise SystemExit(0 if isinstance(exc, Interrupted) else 2) from None
    except Exception:
        if user_error_reported() and not debugging():  # another rank stopped on the user's error: lost peers
            exit_now(2)
        raise


def exit_now(code: int) -> None:
    """End a finished rank without the interpreter's teardown. The stage has written and closed
    everything by now; what the teardown would still destroy are the communication library's
    background threads, and destroying one that is still joinable aborts the process ("terminate
    called without an active exception"), which turned a finished run into a failed one."""
    import logging

    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def user_error_reported() -> bool:
    """Whether a rank has handed the driver a user error (this run is stopping on it)."""
    path = os.environ.get("RLFT_ERROR_FILE")
    return bool(path) and os.path.isfile(path)


def report(exc: Exception) -> None:
    """Hand the one-line error to the driver, which prints it as its last line: the first rank to stop on a
    user error writes it (a rank that fails alone is reported too), the others stay quiet. Started without a
    driver, rank 0 prints it itself."""
    rank = int(os.environ.get("RANK", "0"))
    error_file = os.environ.get("RLFT_ERROR_FILE")
    if not error_file:
        if rank == 0:
            print(f"rlft: error: {exc}", file=sys.stderr, flush=True)
        return
    mine = Path(f"{error_file}.rank{rank}")
    mine.write_text(str(exc))
    try:
        os.link(mine, error_file)  # atomic, and refused when another rank's error is already there
    except FileExistsError:
        pass
    mine.unlink(missing_ok=True)


if __name__ == "__main__":
    main(sys.argv[1:])
