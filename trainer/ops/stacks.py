"""Stacks on demand: ``kill -USR1 <trainer pid>`` (or ``rft status --stacks RUN``) writes every thread's
stack to the run's ``train.log``, for a trainer stuck in its own code.

The dump is :mod:`faulthandler`'s, written from C in the signal handler, so it works while the main
thread holds the interpreter in a long call or waits on a lock. The trainer records its pid in the run
directory (``trainer.pid``, with its start time, so a pid reused by another process is never signalled:
SIGUSR1 ends a process that does not handle it). Torch-free, for ``rft status``.
"""

from __future__ import annotations

import faulthandler
import json
import os
import signal
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

PID_FILE = "trainer.pid"
LOG_FILE = "train.log"  # trainer.run.LOG_FILE, named here too so `rft status` imports no torch
STACKS_TIMEOUT_S = 10.0  # how long `rft status --stacks` waits for the dump to appear


class StacksError(RuntimeError):
    """The run's trainer cannot be asked for its stacks; the message says why."""


def _start_time(pid: int) -> str | None:
    """The process's start time in clock ticks since boot (/proc/PID/stat field 22); None if gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat.rsplit(")", 1)[1].split()[19]


@contextmanager
def stacks_on_demand(run_dir: Path) -> Iterator[None]:
    """While the run is on: SIGUSR1 dumps every thread's stack into ``train.log``; the pid is recorded."""
    log = open(run_dir / LOG_FILE, "a")  # open for the whole run: faulthandler writes to its fd
    faulthandler.register(signal.SIGUSR1, file=log, all_threads=True)
    pid_file = run_dir / PID_FILE
    pid_file.write_text(json.dumps({"pid": os.getpid(), "start_time": _start_time(os.getpid())}))
    try:
        yield
    finally:
        pid_file.unlink(missing_ok=True)
        faulthandler.unregister(signal.SIGUSR1)
        log.close()


def running_trainer(run_dir: Path) -> int:
    """The pid of the trainer running ``run_dir`` now."""
    pid_file = run_dir / PID_FILE
    try:
        recorded = json.loads(pid_file.read_text())
    except FileNotFoundError:
        raise StacksError(f"no trainer is running in {run_dir} (no {PID_FILE}: the run ended)") from None
    pid = int(recorded["pid"])
    if _start_time(pid) != recorded["start_time"]:
        raise StacksError(f"the trainer recorded in {pid_file} (pid {pid}) is gone: it was killed")
    return pid


def request_stacks(run_dir: Path, timeout_s: float = STACKS_TIMEOUT_S) -> str:
    """Signal the run's trainer and return the stacks it wrote to ``train.log``."""
    pid = running_trainer(run_dir)
    log = run_dir / LOG_FILE
    start = log.stat().st_size if log.exists() else 0
    os.kill(pid, signal.SIGUSR1)
    deadline = time.monotonic() + timeout_s
    size = start
    while time.monotonic() < deadline:
        time.sleep(0.2)
        # The dump is written at once; wait until the file stops growing (logging may add lines too).
        current = log.stat().st_size
        if current > start and current == size:
            break
        size = current
    else:
        raise StacksError(f"the trainer (pid {pid}) wrote no stacks to {log} within {timeout_s:.0f} s")
    with open(log, "rb") as handle:
        handle.seek(start)
        return handle.read().decode(errors="replace")
