"""The maze app through the real Strands loop, on uvicorn, against the suite's scripted model server
(``tests/scripted_model.py``) on loopback: scripted turns per rollout, requests and feedback recorded.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from agents.maze.dataset import row_maze
from agents.maze.env import MazeGame
from agents.maze.main import app as maze_app
from agents.maze.observation import OBSERVATION_ENV
from agents.maze.picture import game_png
from agents.maze.render import start_text, step_text
from agents.maze.solver import shortest_path
from handlers.serving import serve_in_thread
from tests.scripted_model import ScriptedModel, Turn, text, tool

JOB_ARN = "arn:aws:sagemaker:us-west-2:123456789012:training-job/maze-test"
ROW = {"seed": 1000001, "size": 5}


def moves(*directions: str) -> list[Turn]:
    """One move call per turn; text ends the episode."""
    directions_moved = ("up", "down", "left", "right")
    return [tool("move", direction=d) if d in directions_moved else text(d) for d in directions]


@pytest.fixture
def model() -> Iterator[tuple[ScriptedModel, str]]:
    scripted = ScriptedModel(default_turn=text("I stop here."))
    with serve_in_thread(scripted.app()) as url:
        yield scripted, url


@pytest.fixture(scope="module")
def agent_url() -> Iterator[str]:
    with serve_in_thread(maze_app) as url:
        yield url


def play(agent_url: str, endpoint: str, rollout_id: str, prompt: Any = ROW) -> httpx.Response:
    body = {
        "prompt": json.dumps(prompt) if isinstance(prompt, dict) else prompt,
        "metadata": {"jobArn": JOB_ARN, "rolloutId": rollout_id, "endpoint": endpoint},
        "inferenceParams": {"temperature": 1.0, "maxTokens": 64},
    }
    return httpx.post(f"{agent_url}/invocations", json=body, timeout=60)


def test_shortest_path_reaches_the_goal(agent_url: str, model: tuple[ScriptedModel, str]) -> None:
    scripted, endpoint = model
    maze = row_maze(ROW)
    path = [direction.value for direction in shortest_path(maze) or []]
    scripted.scripts["win"] = moves(*path)
    response = play(agent_url, endpoint, "win")
    assert response.status_code == 200, response.text
    result = response.json()
    assert result["metrics"] == {"solved": 1.0, "moves": len(path), "stopped": 0.0}
    # The agent stops at the goal: one model call per move, none after.
    requests = scripted.bodies("win")
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
    reports = scripted.feedback("win")
    assert reports["/update-reward"]["Rewards"] == [1.0]
    assert reports["/complete-rollout"]["Status"] == "ready"


def test_walking_into_walls_runs_out_of_moves(agent_url: str, model: tuple[ScriptedModel, str]) -> None:
    scripted, endpoint = model
    maze = row_maze(ROW)
    # Back and forth between two cells never reaches the goal; the agent stops at the move limit.
    first = next(d for d in maze.open_directions(maze.start))
    back = {"up": "down", "down": "up", "left": "right", "right": "left"}[first.value]
    scripted.scripts["lose"] = moves(first.value, back) * maze.move_limit
    result = play(agent_url, endpoint, "lose").json()
    assert result["reward"] == 0.0
    assert result["metrics"] == {"solved": 0.0, "moves": maze.move_limit, "stopped": 0.0}
    assert len(scripted.bodies("lose")) == maze.move_limit
    assert scripted.feedback("lose")["/update-reward"]["Rewards"] == [0.0]


def test_stopping_early_scores_zero(agent_url: str, model: tuple[ScriptedModel, str]) -> None:
    scripted, endpoint = model
    scripted.scripts["stop"] = moves("down", "I am done.")
    result = play(agent_url, endpoint, "stop").json()
    assert result["reward"] == 0.0
    assert result["metrics"] == {"solved": 0.0, "moves": 1.0, "stopped": 1.0}
    assert len(scripted.bodies("stop")) == 2


def test_a_refusing_endpoint_is_no_play(agent_url: str, model: tuple[ScriptedModel, str]) -> None:
    scripted, endpoint = model
    scripted.refuse_status = 400
    response = play(agent_url, endpoint, "refused")
    assert response.status_code == 200 and response.json()["reward"] == 0.0
    assert scripted.feedback("refused")["/complete-rollout"]["Status"] == "ready"


def test_a_row_without_a_maze_is_rejected(agent_url: str, model: tuple[ScriptedModel, str]) -> None:
    _, endpoint = model
    response = play(agent_url, endpoint, "bad", prompt={"size": 5})
    assert response.status_code == 400
    assert "a maze row must be like" in response.json()["error"]
    assert "seed" in response.json()["error"]


def _image_bytes(part: dict[str, Any]) -> bytes:
    assert part["type"] == "image_url"
    url = part["image_url"]["url"]
    assert url.startswith("data:image/png;base64,")
    return base64.b64decode(url.removeprefix("data:image/png;base64,"))


def _assert_image_turns(requests: list[dict[str, Any]], path: list[str]) -> None:
    """The opening picture in the user message, then each move's picture after its tool message."""
    game = MazeGame(row_maze(ROW))
    first = requests[0]["messages"][1]["content"]
    assert first[0] == {"type": "text", "text": f"Maze 5x5. Moves left: {game.maze.move_limit}."}
    assert _image_bytes(first[1]) == game_png(game)
    # No text observation: the picture is what the policy has to go on.
    assert "Closer" not in json.dumps(requests) and "Goal:" not in json.dumps(requests)
    for request, direction in zip(requests[1:], path, strict=False):
        game.step(direction)
        *_, tool_message, pictures = request["messages"]
        assert tool_message["role"] == "tool"
        assert tool_message["content"][0]["text"] == f"Moved. Moves left: {game.moves_left}."
        assert pictures["role"] == "user" and _image_bytes(pictures["content"][0]) == game_png(game)


def test_image_observations_through_the_strands_loop(
    agent_url: str, model: tuple[ScriptedModel, str]
) -> None:
    scripted, endpoint = model
    path = [direction.value for direction in shortest_path(row_maze(ROW)) or []]
    scripted.scripts["seen"] = moves(*path)
    response = play(agent_url, endpoint, "seen", prompt={**ROW, "observation": "image"})
    assert response.status_code == 200, response.text
    # Same tool, same reward as with text.
    assert response.json()["metrics"] == {"solved": 1.0, "moves": len(path), "stopped": 0.0}
    requests = scripted.bodies("seen")
    assert len(requests) == len(path)
    assert [tool["function"]["name"] for tool in requests[0]["tools"]] == ["move"]
    _assert_image_turns(requests, path)


def test_the_agent_setting_chooses_images_when_the_row_does_not(
    agent_url: str, model: tuple[ScriptedModel, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    scripted, endpoint = model
    monkeypatch.setenv(OBSERVATION_ENV, "image")
    scripted.scripts["setting"] = moves("down", "I stop.")
    assert play(agent_url, endpoint, "setting").status_code == 200
    assert scripted.bodies("setting")[0]["messages"][1]["content"][1]["type"] == "image_url"
    # A row's own choice wins over the setting.
    scripted.scripts["row"] = moves("I stop.")
    assert play(agent_url, endpoint, "row", prompt={**ROW, "observation": "text"}).status_code == 200
    assert "image_url" not in json.dumps(scripted.bodies("row"))


def test_an_unknown_observation_is_rejected(agent_url: str, model: tuple[ScriptedModel, str]) -> None:
    _, endpoint = model
    response = play(agent_url, endpoint, "bad-observation", prompt={**ROW, "observation": "smell"})
    assert response.status_code == 400
    assert "observation must be one of text, image, got 'smell'" in response.json()["error"]
