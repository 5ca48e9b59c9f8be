"""The template agent: its tool and reward, and whole episodes through the real Strands loop against the
scripted model on loopback, one of them in a Python where torch cannot be imported."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import textwrap
from typing import Any

import httpx
import pytest

from agents.template.main import NO_PLAY_REWARD, SOLVED_REWARD, WRONG_REWARD, app, calculate, evaluate, reward

ROW = json.dumps({"question": "What is 12 * (3 + 4)?", "answer": 84})


def plays_with_the_tool(body: dict[str, Any], headers: dict[str, str]) -> dict[str, Any]:
    """First turn: call the tool; once a tool result is in the history: answer with it."""
    tool_results = [m for m in body["messages"] if m["role"] == "tool"]
    if not tool_results:
        return {"tool": "calculate", "arguments": {"expression": "12 * (3 + 4)"}}
    content = tool_results[-1]["content"]
    text = content if isinstance(content, str) else "".join(part["text"] for part in content)
    return {"content": f"The answer is\n{text}"}


@pytest.mark.parametrize(
    ("expression", "value"), [("12 * (3 + 4)", 84), ("-2 + 7 / 2", 1.5), ("((1))", 1), ("2 - -3", 5)]
)
def test_evaluate_does_arithmetic(expression: str, value: float) -> None:
    assert evaluate(expression) == value


@pytest.mark.parametrize("expression", ["__import__('os')", "2 ** 8", "x + 1", "1 +", "'a' * 3", "True + 1"])
def test_evaluate_refuses_anything_else(expression: str) -> None:
    with pytest.raises(ValueError):
        evaluate(expression)


def test_the_tool_reports_errors_to_the_model_instead_of_raising() -> None:
    assert calculate("1 / 0") == "cannot evaluate '1 / 0': division by zero"
    assert calculate("6 * 7") == "42"


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("84", SOLVED_REWARD),
        ("so it is 84.0", SOLVED_REWARD),
        ("1,084", WRONG_REWARD),
        ("84 or 85", WRONG_REWARD),
        ("", WRONG_REWARD),
    ],
)
def test_reward_reads_the_last_number(text: str, expected: float) -> None:
    assert reward(text, 84) == expected


def test_a_wrong_answer_scores_zero_in_process(model: Any, payload: Any) -> None:
    model.script = lambda body, headers: {"content": "It is 85."}

    async def run() -> httpx.Response:
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://agent", timeout=30) as client:
            return await client.post("/invocations", json=payload("t1", model.url, prompt=ROW))

    response = asyncio.run(run())
    assert (response.status_code, response.json()["reward"]) == (200, WRONG_REWARD)
    assert len(model.calls) == 1 and model.calls[0].body["stream"] is True
    assert model.reports("t1")[0][0]["Rewards"] == [WRONG_REWARD]
    assert NO_PLAY_REWARD < WRONG_REWARD < SOLVED_REWARD


TORCH_FREE_RUN = textwrap.dedent(
    """
    import asyncio, importlib.abc, json, sys

    BLOCKED = {"torch", "transformers", "peft", "tokenizers"}

    class BlockTraining(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path=None, target=None):
            if name.split(".")[0] in BLOCKED:
                raise ModuleNotFoundError(f"No module named {name!r} (blocked by the test)", name=name)
            return None

    sys.meta_path.insert(0, BlockTraining())

    import httpx
    import handlers
    from handlers import RolloutContext, rft_app, rft_handler
    from agents.template.main import app

    async def run():
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://agent", timeout=30) as client:
            return await client.post("/invocations", json=json.loads(sys.argv[1]))

    response = asyncio.run(run())
    loaded = sorted({m.split(".")[0] for m in sys.modules} & BLOCKED)
    print(json.dumps({"status": response.status_code, "body": response.json(), "loaded": loaded}))
    """
)


def test_handlers_and_the_template_agent_run_without_torch(model: Any, payload: Any) -> None:
    model.script = plays_with_the_tool
    body = json.dumps(payload("t2", model.url, prompt=ROW))
    result = subprocess.run(
        [sys.executable, "-c", TORCH_FREE_RUN, body], capture_output=True, text=True, timeout=120, check=False
    )
    assert result.returncode == 0, result.stderr[-3000:]
    outcome = json.loads(result.stdout.strip().splitlines()[-1])
    assert outcome["loaded"] == []
    assert outcome["status"] == 200 and outcome["body"]["reward"] == SOLVED_REWARD
    # A real two-turn Strands episode: a tool call, then the answer built from the tool's result.
    assert len(model.calls) == 2
    assert [m["role"] for m in model.calls[1].body["messages"]][-2:] == ["assistant", "tool"]
    assert all(call.rollout[1] == "t2" for call in model.calls)
    assert model.reports("t2")[0][0]["Rewards"] == [SOLVED_REWARD]
