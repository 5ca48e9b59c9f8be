"""Child processes that never outlive the rft process that started them: the one way rftkit starts one.

A child started with :func:`tied_popen` asks the kernel (Linux ``prctl(PR_SET_PDEATHSIG)``, in the
child before exec) for SIGTERM when its parent ends, however it ends: a normal exit, an exception, or
SIGKILL, which runs no ``finally``. The signal follows the thread that started the child, so start
children from the main thread or from a thread that lives as long as they should (the gateway
pool's state loop, the policy server's loop).

Grandchildren get no signal from the kernel: a command that starts helpers of its own (vLLM) runs
with ``group=True`` under :mod:`handlers.lifeline`, which passes the stop on to its whole process
group and kills what outlives the grace. Elsewhere than Linux the children are only stopped by the
launcher's own cleanup.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

PR_SET_PDEATHSIG = 1  # linux/prctl.h
LIFELINE = Path(__file__).with_name("lifeline.py")


def die_with_parent(signum: int = signal.SIGTERM) -> Callable[[], None] | None:
    """A ``preexec_fn`` that ties the child to this process (None where the kernel cannot).

    Built in the parent, so the child only makes the call; if the parent is already gone by then
    (it died between fork and prctl), the child sends itself the signal.
    """
    if not sys.platform.startswith("linux"):
        return None
    import ctypes

    prctl = ctypes.CDLL(None, use_errno=True).prctl
    parent = os.getpid()

    def tie() -> None:
        prctl(PR_SET_PDEATHSIG, signum)
        if os.getppid() != parent:
            os.kill(os.getpid(), signum)

    return tie


def tied_popen(command: Sequence[str], *, group: bool = False, **kwargs: Any) -> subprocess.Popen[bytes]:
    """``subprocess.Popen(command, **kwargs)`` whose process ends when this one does.

    ``group``: the command may start processes of its own; it runs under the lifeline, as the leader
    of a new session and process group (so ``os.killpg(process.pid, ...)`` reaches all of them), and
    the returned process is the lifeline, which exits with the command's exit code.
    """
    if "preexec_fn" in kwargs:
        raise TypeError("tied_popen sets preexec_fn itself (the parent-death signal)")
    argv = list(command)
    if group and sys.platform.startswith("linux"):
        argv = [sys.executable, "-I", str(LIFELINE), *argv]
        kwargs["start_new_session"] = True
    return subprocess.Popen(argv, preexec_fn=die_with_parent(), **kwargs)
