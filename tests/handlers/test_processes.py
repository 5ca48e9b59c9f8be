"""Every process rft starts ends with the process that started it, even one SIGKILLed (no orphans)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable

from handlers import tied_popen
from tests.process_tree import alive, descendants

# A launcher as rft's are: a server under the lifeline that starts a helper of its own (as vLLM starts
# its engine core), a tied worker (as the gateway's), and, for contrast, a child started plainly.
LAUNCHER = """
import json, subprocess, sys, time
from handlers import tied_popen
sleep = [sys.executable, "-c", "import time; time.sleep(60)"]
helper = f"import subprocess, time; subprocess.Popen({sleep!r}); time.sleep(60)"
server = tied_popen([sys.executable, "-c", helper], group=True)
worker = tied_popen(sleep)
plain = subprocess.Popen(sleep)
print(json.dumps({"server": server.pid, "worker": worker.pid, "plain": plain.pid}), flush=True)
time.sleep(60)
"""


def _wait_until(condition: Callable[[], bool], timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.05)
    return False


def _tree_of(pid: int, expected: int, timeout_s: float = 30.0) -> list[int]:
    """The processes below ``pid`` once ``expected`` of them are up (the helper starts last)."""
    found: list[int] = []

    def complete() -> bool:
        found[:] = descendants(pid)
        return len(found) >= expected

    assert _wait_until(complete, timeout_s), f"only {found} started below {pid}"
    return found


def test_sigkilled_launcher_leaves_no_tied_process_or_grandchild() -> None:
    launcher = subprocess.Popen([sys.executable, "-c", LAUNCHER], stdout=subprocess.PIPE, text=True)
    try:
        assert launcher.stdout is not None
        pids = json.loads(launcher.stdout.readline())
        # lifeline, the server, its helper, the worker, the plain child
        tree = _tree_of(launcher.pid, expected=5)
        os.kill(launcher.pid, signal.SIGKILL)
        launcher.wait(timeout=10)
        tied = [pid for pid in tree if pid != pids["plain"]]
        assert _wait_until(lambda: not any(alive(pid) for pid in tied), 30), [p for p in tied if alive(p)]
        # The check can fail: a child started without tied_popen outlives the SIGKILL.
        assert alive(pids["plain"])
    finally:
        for pid in descendants(launcher.pid) + ([pids["plain"]] if "pids" in locals() else []):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        if launcher.poll() is None:
            launcher.kill()
            launcher.wait()


def test_lifeline_passes_on_the_exit_code_and_stops_helpers_left_behind() -> None:
    # The command exits by itself with code 3, leaving a helper running: the lifeline stops it.
    command = (
        "import subprocess, sys; "
        "helper = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)']); "
        "print(helper.pid, flush=True); sys.exit(3)"
    )
    process = tied_popen([sys.executable, "-c", command], group=True, stdout=subprocess.PIPE)
    assert process.stdout is not None
    helper = int(process.stdout.readline())
    assert process.wait(timeout=30) == 3
    assert not alive(helper)


def test_sigterm_to_the_group_stops_the_command_and_its_helpers() -> None:
    """What the vllm engine's close does: SIGTERM to the process group, then wait."""
    command = (
        "import subprocess, sys, time; "
        "helper = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)']); "
        "print(helper.pid, flush=True); time.sleep(60)"
    )
    process = tied_popen([sys.executable, "-c", command], group=True, stdout=subprocess.PIPE)
    assert process.stdout is not None
    helper = int(process.stdout.readline())
    os.killpg(process.pid, signal.SIGTERM)
    assert process.wait(timeout=30) == 128 + signal.SIGTERM
    assert not alive(helper)
