"""The demo's maze agent runs in its own process and ends with the demo, however the demo ends."""

from __future__ import annotations

import contextlib
import subprocess
import sys

import httpx
import psutil

SCRIPT = """
import time
from agents.maze.demo.agent_process import serve_agent
with serve_agent() as url:
    print(url, flush=True)
    time.sleep(600)
"""


def test_the_maze_agent_exits_when_the_demo_is_killed() -> None:
    demo = subprocess.Popen([sys.executable, "-c", SCRIPT], stdout=subprocess.PIPE, text=True)
    agents: list[psutil.Process] = []
    try:
        assert demo.stdout is not None
        url = demo.stdout.readline().strip()
        assert httpx.get(f"{url}/ping", timeout=10).status_code == 200
        agents = psutil.Process(demo.pid).children()
        assert len(agents) == 1
        demo.kill()  # SIGKILL: the demo's own clean-up never runs
        demo.wait(timeout=30)
        agents[0].wait(timeout=30)  # psutil.TimeoutExpired if the agent outlived the demo
    finally:
        demo.kill()
        for agent in agents:
            with contextlib.suppress(psutil.NoSuchProcess):
                agent.kill()
