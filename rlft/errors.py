"""The mistakes a user can fix, as exception types: the driver and every rank report them as one
`rlft: error:` line (exit code 2) instead of a traceback. Kept apart from the modules that raise
them so that the command line, the driver and the ranks share them without importing each other."""
from __future__ import annotations

import os


class ConfigError(ValueError):
    """A configuration problem, reported as one line naming the fix."""


class DataError(ValueError):
    """A problem with the user's data, reported in one line that says where and how to fix it."""


class UnknownNameError(KeyError):
    """A name that no registry, environment or import path knows."""

    def __str__(self) -> str:  # KeyError would wrap the message in quotes
        return str(self.args[0])


class MissingInputError(FileNotFoundError):
    """An input checkpoint does not exist; the message names the command that makes it."""


class LaunchError(RuntimeError):
    """The ranks could not be started, or stopped without a result."""


class RankUserError(LaunchError):
    """A rank stopped on a user error (bad data, missing input); its one-line message."""


class RunDirError(RuntimeError):
    """The stage directory cannot be written by this run (reported as one line)."""


class StageLockedError(RunDirError):
    """Another live run is writing this stage directory."""


class CompletedStageError(RunDirError):
    """The stage directory holds a completed stage and neither resume nor overwrite was asked for."""


class StageError(RuntimeError):
    """A stage cannot go on for a reason the user can fix; reported as one line."""


class NonFiniteError(RuntimeError):
    """Training produced non-finite values (loss, gradients or weights); nothing non-finite is saved."""


class DiskFullError(OSError):
    """Not enough disk space for what a stage must write; what was there before stays intact."""


class RewardError(RuntimeError):
    """A user reward function broke its contract (one finite number per completion) or raised; one line."""


class Interrupted(RuntimeError):
    """Training stopped on a signal (after writing a checkpoint when it could)."""


USER_ERRORS = (ConfigError, DataError, MissingInputError, LaunchError, UnknownNameError, StageError, NonFiniteError,
               RunDirError, Interrupted, DiskFullError, RewardError)
"""What the command line and the ranks print as one line; anything else is rlft's own bug (a traceback)."""


def debugging() -> bool:
    """RLFT_DEBUG=1: a user error shows its traceback too (each rank's, and the launcher's report), before its line."""
    return os.environ.get("RLFT_DEBUG", "") not in ("", "0")
