"""The maze app through the real Strands loop, on uvicorn, against a scripted model server on loopback.

The model server answers OpenAI chat completions as Strands asks for them (SSE), replaying scripted
turns per rollout (picked by the trajectory-id header), and records requests and feedback posts.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import httpx
import pytest
import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from agents.maze.dataset import row_maze
from agents.maze.env import MazeGame
from agents.maze.main import app as maze_app
from agents.maze.render import start_text, step_text
from agents.maze.solver import shortest_path
from handlers import TRAJECTORY_ID_HEADER

JOB_ARN = "arn:aws:sagemaker:us-west-2:123456789012:training-job/maze-test"
ROW = {"seed": 1000001, "size": 5}
# A turn is a direction (one move call) or plain text (the model stops).
Turn = str


@dataclass
class ScriptedModel:
    scripts: dict[str, list[Turn]] = field(default_factory=dict)
    refuse: bool = False
    requests: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    reports: list[tuple[str, dict[str, Any]]] = field(default_factory=list)

    def app(self) -> Starlette:
        return Starlette(
            routes=[
                Route("/v1/chat/completions", self.chat, methods=["POST"]),
                Route("/complete-rollout", self.report, methods=["POST"]),
                Route("/update-reward", self.report, methods=["POST"]),
            ]
        )

    async def chat(self, request: Request) -> Response:
        rollout_id = request.headers[TRAJECTORY_ID_HEADER]
        self.requests.setdefault(rollout_id, []).append(await request.json())
        if self.refuse:
            return JSONResponse({"error": {"message": "Could not find job", "code": 400}}, 400)
        script = self.scripts[rollout_id]
        turn = script.pop(0) if script else "I stop here."
        return StreamingResponse(self._stream(turn), media_type="text/event-stream")

    async def report(self, request: Request) -> Response:
        self.reports.append((request.url.path, await request.json()))
        return JSONResponse({})

    @staticmethod
    def _stream(turn: Turn) -> Iterator[str]:
        def chunk(delta: dict[str, Any], finish: str | None = None) -> str:
            body = {"id": "c", "object": "chat.completion.chunk", "created": 0, "model": "default"}
            body["choices"] = [{"index": 0, "delta": delta, "finish_reason": finish}]
            return f"data: {json.dumps(body)}\n\n"

        yield chunk({"role": "assistant", "content": ""})
        if turn in ("up", "down", "left", "right"):
            arguments = json.dumps({"direction": turn})
            call = {
                "index": 0,
                "id": "call_0",
                "type": "function",
                "function": {"name": "move", "arguments": arguments},
            }
            yield chunk({"tool_calls": [call]})
            yield chunk({}, "tool_calls")
        else:
            yield chunk({"content": turn})
            yield chunk({}, "stop")
        yield "data: [DONE]\n\n"


class LoopbackServer:
    """uvicorn serving an ASGI app on 127.0.0.1 and a free port, in a background thread."""

    def __init__(self, app: Any) -> None:
        self.server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=0, log_level="warning"))
        self.thread = threading.Thread(target=self.server.run, daemon=True)

    def __enter__(self) -> str:
        self.thread.start()
        deadline = time.monotonic() + 10
        while not self.server.started:
            if time.monotonic() > deadline or not self.thread.is_alive():
                raise RuntimeError("the loopback server did not start")
            time.sleep(0.01)
        return f"http://127.0.0.1:{self.server.servers[0].sockets[0].getsockname()[1]}"

    def __exit__(self, *exc: object) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=10)


@pytest.fixture
def model() -> Iterator[tuple[ScriptedModel, str]]:
    scripted = ScriptedModel()
    with LoopbackServer(scripted.app()) as url:
        yield scripted, url


@pytest.fixture(scope="module")
def agent_url() -> Iterator[str]:
    with LoopbackServer(maze_app) as url:
        yield url


def play(agent_url: str, endpoint: str, rollout_id: str, prompt: Any = ROW) -> httpx.Response:
    body = {
        "prompt": json.dumps(prompt) if isinstance(prompt, dict) else prompt,
        "metadata": {"jobArn": JOB_ARN, "rolloutId": rollout_id, "endpoint": endpoint},
        "inferenceParams": {"temperature": 1.0, "maxTokens": 64},
    }
    return httpx.post(f"{agent_url}/invocations", json=body, timeout=60)


def reports_for(scripted: ScriptedModel, rollout_id: str) -> dict[str, dict[str, Any]]:
    return {path: body for path, body in scripted.reports if body["TrajectoryId"] == rollout_id}


def test_shortest_path_reaches_the_goal(agent_url: str, model: tuple[ScriptedModel, str]) -> None:
    scripted, endpoint = model
    maze = row_maze(ROW)
    path = [direction.value for direction in shortest_path(maze) or []]
    scripted.scripts["win"] = list(path)
    response = play(agent_url, endpoint, "win")
    assert response.status_code == 200, response.text
    result = response.json()
    assert result["metrics"] == {"solved": 1.0, "moves": len(path), "stopped": 0.0}
    # The agent stops at the goal: one model call per move, none after.
    requests = scripted.requests["win"]
    assert len(requests) == len(path)
    game = MazeGame(maze)
    first = requests[0]["messages"]
    assert first[0]["role"] == "system"
    assert start_text(game) in json.dumps(first[1]["content"])
    assert [tool["function"]["name"] for tool in requests[0]["tools"]] == ["move"]
    step = game.step(path[0])
    assert requests[1]["messages"][-1] == {
        "role": "tool",
        "tool_call_id": "call_0",
        "content": step_text(game, step),
    }
    # Every later call sees only the system prompt, the previous move and its observation.
    assert [[m["role"] for m in r["messages"]] for r in requests[1:]] == [["system", "assistant", "tool"]] * (
        len(path) - 1
    )
    reports = reports_for(scripted, "win")
    assert reports["/update-reward"]["Rewards"] == [1.0]
    assert reports["/complete-rollout"]["Status"] == "ready"


def test_walking_into_walls_runs_out_of_moves(agent_url: str, model: tuple[ScriptedModel, str]) -> None:
    scripted, endpoint = model
    maze = row_maze(ROW)
    # Back and forth between two cells never reaches the goal; the agent stops at the move limit.
    first = next(d for d in maze.open_directions(maze.start))
    back = {"up": "down", "down": "up", "left": "right", "right": "left"}[first.value]
    scripted.scripts["lose"] = [first.value, back] * maze.move_limit
    result = play(agent_url, endpoint, "lose").json()
    assert result["reward"] == 0.0
    assert result["metrics"] == {"solved": 0.0, "moves": maze.move_limit, "stopped": 0.0}
    assert len(scripted.requests["lose"]) == maze.move_limit
    assert reports_for(scripted, "lose")["/update-reward"]["Rewards"] == [0.0]


def test_stopping_early_scores_zero(agent_url: str, model: tuple[ScriptedModel, str]) -> None:
    scripted, endpoint = model
    scripted.scripts["stop"] = ["down", "I am done."]
    result = play(agent_url, endpoint, "stop").json()
    assert result["reward"] == 0.0
    assert result["metrics"] == {"solved": 0.0, "moves": 1.0, "stopped": 1.0}
    assert len(scripted.requests["stop"]) == 2


def test_a_refusing_endpoint_is_no_play(agent_url: str, model: tuple[ScriptedModel, str]) -> None:
    scripted, endpoint = model
    scripted.refuse = True
    response = play(agent_url, endpoint, "refused")
    assert response.status_code == 200 and response.json()["reward"] == 0.0
    assert reports_for(scripted, "refused")["/complete-rollout"]["Status"] == "ready"


def test_a_row_without_a_maze_is_rejected(agent_url: str, model: tuple[ScriptedModel, str]) -> None:
    _, endpoint = model
    response = play(agent_url, endpoint, "bad", prompt={"size": 5})
    assert response.status_code == 400
    assert "a maze row must be like" in response.json()["error"]
    assert "seed" in response.json()["error"]
