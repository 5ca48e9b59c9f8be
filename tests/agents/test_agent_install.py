"""The agent side installs and runs without torch: what an agent container gets from `pip install .`."""

from __future__ import annotations

import socket
import subprocess
import time
from pathlib import Path

import httpx

REPO_ROOT = Path(__file__).resolve().parents[2]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def test_base_install_has_no_torch_and_imports_the_agent_side(agent_python: str) -> None:
    script = (
        "import importlib.util, sys\n"
        "assert importlib.util.find_spec('torch') is None, 'torch is installed in the agent environment'\n"
        "import handlers, agents.wordle.main, agents.template.main\n"
        "from handlers import rft_app, rft_handler, RolloutContext\n"
        "assert 'torch' not in sys.modules\n"
        "print('ok')\n"
    )
    result = subprocess.run(
        [agent_python, "-c", script], capture_output=True, text=True, timeout=120, cwd="/"
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "ok"


def test_wordle_agent_from_the_base_install_passes_rft_smoke(agent_python: str, tmp_path: Path) -> None:
    """`python agents/wordle/main.py` then `rft smoke URL`, both from the torch-free environment."""
    port = free_port()
    agent = subprocess.Popen(
        [agent_python, "-c", f"from agents.wordle.main import app; app.run(port={port})"],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        cwd=tmp_path,
    )
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                if httpx.get(f"http://127.0.0.1:{port}/ping", timeout=2).status_code == 200:
                    break
            except httpx.TransportError:
                time.sleep(0.2)
        rft = str(Path(agent_python).parent / "rft")
        smoke = subprocess.run(
            [
                rft,
                "smoke",
                f"http://127.0.0.1:{port}",
                "--payload",
                str(REPO_ROOT / "agents" / "wordle" / "payloads" / "smoke.json"),
            ],
            capture_output=True,
            text=True,
            timeout=120,
            cwd=tmp_path,
        )
    finally:
        agent.terminate()
        agent.wait(timeout=30)
    assert smoke.returncode == 0, smoke.stdout + smoke.stderr
    assert "Could not find job" in smoke.stdout
    assert "-1.5" in smoke.stdout
