"""Run a command so that it and every process it starts end when the launcher ends.

``python -I lifeline.py COMMAND...`` (started by :func:`handlers.processes.tied_popen` with
``group=True``, as its own session, with the parent-death signal set): runs COMMAND in its process
group and stays its parent. SIGTERM, SIGINT or SIGHUP (which the kernel sends when the launcher dies,
even by SIGKILL) goes to the whole group, so a server that starts helpers of its own (vLLM's engine
core and its workers) is stopped with them; what outlives ``GRACE_S`` is killed. It is also the
group's subreaper: helpers orphaned when COMMAND exits by itself are stopped too, and it exits with
COMMAND's exit code.

Run by path and isolated (``-I``), never imported as part of ``handlers``: it imports nothing but the
standard library, so it starts in milliseconds and whatever Python runs it.
"""

from __future__ import annotations

import ctypes
import os
import signal
import subprocess
import sys
from types import FrameType

PR_SET_PDEATHSIG = 1  # linux/prctl.h
PR_SET_CHILD_SUBREAPER = 36
GRACE_S = 20  # how long the group may take to stop after SIGTERM before SIGKILL (vLLM takes seconds)

_stopping = False


def _stop_group(signum: int, frame: FrameType | None) -> None:
    """Pass a stop signal on to the whole group once; SIGKILL the group if it outlives the grace."""
    global _stopping
    if _stopping:
        return
    _stopping = True
    signal.signal(signal.SIGALRM, _kill_group)
    signal.alarm(GRACE_S)
    os.killpg(0, signal.SIGTERM)


def _kill_group(signum: int, frame: FrameType | None) -> None:
    os.killpg(0, signal.SIGKILL)


def _reap_all() -> None:
    """Wait for every remaining descendant (as subreaper, orphans become this process's children)."""
    while True:
        try:
            os.wait()
        except ChildProcessError:
            return


def main(argv: list[str]) -> int:
    if not argv:
        print("usage: lifeline.py COMMAND [ARG...]", file=sys.stderr)
        return 2
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(PR_SET_CHILD_SUBREAPER, 1)
    for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(signum, _stop_group)
    child = subprocess.Popen(argv, preexec_fn=lambda: libc.prctl(PR_SET_PDEATHSIG, signal.SIGTERM))
    code = child.wait()
    _stop_group(signal.SIGTERM, None)
    _reap_all()
    return code if code >= 0 else 128 - code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
