"""`python -m rlft.rank_launcher <torch.distributed.run arguments>`: torch's elastic launcher, started by the driver
(rlft.launch) to run the ranks.

It is torch.distributed.run itself, with one difference: when the ranks stopped on a user error that rank 0 has
already handed to the driver (the file named by RLFT_ERROR_FILE, printed as one `rlft: error:` line), the
launcher's own report of the failed ranks (its log line, a traceback and a table per rank) is left out and it
exits with 2.
Any other failure is reported in full, as torch.distributed.run does.
"""
from __future__ import annotations

import logging
import sys

from rlft.errors import debugging
from rlft.worker import user_error_reported


class QuietAfterUserError(logging.Filter):
    """Drops the launcher's log records of failed and stopped ranks once a rank has reported a user error."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not (record.levelno >= logging.WARNING and user_error_reported() and not debugging())


def main() -> None:
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.run import main as torchrun

    logging.getLogger("torch.distributed.elastic.multiprocessing.api").addFilter(QuietAfterUserError())
    try:
        torchrun()
    except ChildFailedError:
        if user_error_reported() and not debugging():
            sys.exit(2)
        raise


if __name__ == "__main__":
    main()
