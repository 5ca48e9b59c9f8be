"""``rft train`` that sends itself a signal the moment it logs a given line, so a test's signal lands
at that phase of the run whatever the machine's load (a test that waits for the line in the log file
and then signals can land after a phase of a few milliseconds has ended).

    python -m tests.trainer.signal_on_log SIGNUM TEXT train CONFIG [rft train's arguments]
"""

from __future__ import annotations

import logging
import os
import sys

from handlers.cli import main
from trainer.run import LOG_HANDLER_NAME


class SignalOnLine(logging.Handler):
    """Sends this process ``signum`` at the first record whose message holds ``text``.

    Added before the run's log file handler, it sees the record first; the line goes to the log file
    before the signal does, so the log reads in the order things happened (Python runs the signal's
    handler at once, and that handler logs too)."""

    def __init__(self, signum: int, text: str) -> None:
        super().__init__()
        self.signum, self.text, self.sent = signum, text, False

    def emit(self, record: logging.LogRecord) -> None:
        if self.sent or self.text not in record.getMessage():
            return
        self.sent = True
        for handler in logging.getLogger("trainer").handlers:
            if handler.get_name() == LOG_HANDLER_NAME:
                handler.handle(record)
                handler.addFilter(lambda later: later is not record)  # written once
        os.kill(os.getpid(), self.signum)


if __name__ == "__main__":
    signum, text, *argv = sys.argv[1:]
    # On the trainer's logger, not the root: the CLI's own logging set-up stays as a user sees it.
    logging.getLogger("trainer").addHandler(SignalOnLine(int(signum), text))
    sys.exit(main(argv))
