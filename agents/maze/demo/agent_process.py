"""A demo's agent served as it would be deployed: its ``BedrockAgentCoreApp`` on uvicorn, in its own
process (and off the trainer's interpreter lock). The maze's by default; ``rft demo --task wordle``
serves the Wordle agent the same way."""

from __future__ import annotations

import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager

from handlers import tied_popen

START_TIMEOUT_S = 300.0  # how long the agent may take to answer /ping before the demo gives up


@contextmanager
def serve_agent(module: str = "agents.maze.main") -> Iterator[str]:
    """The ``app`` of the agent ``module`` (a ``BedrockAgentCoreApp``) on uvicorn in its own process, as
    it would be deployed (and off the trainer's interpreter lock); yields its URL and stops it on the
    way out."""
    import socket
    import subprocess

    import httpx

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    # One INFO line per rollout from the app would bury the progress bar.
    launch = (
        f"import logging; from {module} import app; "
        "logging.getLogger('bedrock_agentcore.app').setLevel(logging.WARNING); "
        f"app.run(port={port}, host='127.0.0.1', log_level='warning')"
    )
    # Tied to the demo's process: stopped by SIGTERM or SIGKILL, the demo never reaches its `finally`.
    process = tied_popen([sys.executable, "-c", launch])
    url = f"http://127.0.0.1:{port}"
    try:
        # Only bounds a hang: importing the app takes seconds idle, far longer on a loaded machine.
        deadline = time.monotonic() + START_TIMEOUT_S
        while True:
            if process.poll() is not None:
                raise RuntimeError(f"the agent {module} exited with code {process.returncode} before serving")
            try:
                if httpx.get(f"{url}/ping", timeout=1.0).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(
                    f"the agent {module} did not answer {url}/ping within {START_TIMEOUT_S:.0f} s"
                )
            time.sleep(0.2)
        yield url
    finally:
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
