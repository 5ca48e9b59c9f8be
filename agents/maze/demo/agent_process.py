"""The maze agent served as it would be deployed: its ``BedrockAgentCoreApp`` on uvicorn, in its own
process (and off the trainer's interpreter lock)."""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

PR_SET_PDEATHSIG = 1  # linux/prctl.h
START_TIMEOUT_S = 300.0  # how long the agent may take to answer /ping before the demo gives up


def _death_signal() -> Callable[[], None] | None:
    """What the agent's process runs before it starts, on Linux: ask the kernel for SIGTERM when the
    demo's process ends, however it ends (stopped by SIGTERM or SIGKILL the demo never reaches its
    ``finally``, and the agent would keep serving). Built here, so the child only makes the call."""
    if not sys.platform.startswith("linux"):
        return None
    import ctypes
    import signal

    prctl = ctypes.CDLL(None).prctl
    return lambda: prctl(PR_SET_PDEATHSIG, signal.SIGTERM)


@contextmanager
def serve_agent() -> Iterator[str]:
    """The maze agent's ``BedrockAgentCoreApp`` on uvicorn in its own process, as it would be deployed
    (and off the trainer's interpreter lock); yields its URL and stops it on the way out."""
    import socket
    import subprocess

    import httpx

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    # One INFO line per rollout from the app would bury the progress bar.
    launch = (
        "import logging; from agents.maze.main import app; "
        "logging.getLogger('bedrock_agentcore.app').setLevel(logging.WARNING); "
        f"app.run(port={port}, host='127.0.0.1', log_level='warning')"
    )
    process = subprocess.Popen([sys.executable, "-c", launch], preexec_fn=_death_signal())
    url = f"http://127.0.0.1:{port}"
    try:
        # Only bounds a hang: importing the app takes seconds idle, far longer on a loaded machine.
        deadline = time.monotonic() + START_TIMEOUT_S
        while True:
            if process.poll() is not None:
                raise RuntimeError(f"the maze agent exited with code {process.returncode} before serving")
            try:
                if httpx.get(f"{url}/ping", timeout=1.0).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(f"the maze agent did not answer {url}/ping within {START_TIMEOUT_S:.0f} s")
            time.sleep(0.2)
        yield url
    finally:
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
