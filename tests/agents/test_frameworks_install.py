"""rftkit installs beside other agent frameworks: the OpenAI Agents SDK's import name is `agents`, the
folder name of rftkit's example agents, which therefore ship as a namespace portion (no
`agents/__init__.py`) and never shadow the SDK, neither installed nor from a checkout."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]

BOTH = (
    "import agents\n"
    "from agents import Agent, OpenAIChatCompletionsModel, Runner, function_tool\n"
    "from handlers import RolloutContext, rft_app, rft_handler\n"
    "import agents.maze.env, agents.wordle.game\n"
    "import langgraph, langchain_openai\n"
    "print(Agent.__module__, agents.maze.env.__name__)\n"
)


@pytest.mark.parametrize("where", ["checkout", "elsewhere"])
def test_the_openai_agents_sdk_and_rftkit_import_side_by_side(frameworks_python: str, where: str) -> None:
    """From the checkout's root, where an `agents/__init__.py` used to shadow the SDK, and from `/`."""
    cwd = REPO_ROOT if where == "checkout" else Path("/")
    result = subprocess.run(
        [frameworks_python, "-c", BOTH], capture_output=True, text=True, timeout=180, cwd=cwd
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["agents.agent", "agents.maze.env"]


def test_the_example_agents_claim_no_package_init() -> None:
    assert not (REPO_ROOT / "agents" / "__init__.py").exists()
