"""Full rollouts of the real Wordle app through the real Strands loop against a scripted model server.

The model server is a small Starlette app on 127.0.0.1 that answers OpenAI chat completions the way
Strands asks for them (streamed as SSE), replaying a scripted list of turns per rollout (chosen by the
rollout's trajectory-id header), and records the feedback posts the agent makes.
"""

from __future__ import annotations

import asyncio
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

from agents.wordle.main import app as wordle_app
from handlers import JOB_ARN_HEADER, TRAJECTORY_ID_HEADER

JOB_ARN = "arn:aws:sagemaker:us-west-2:123456789012:training-job/wordle-test"

# A turn is either a list of guesses (one tool call each, in one assistant message) or plain text.
Turn = list[str] | str


@dataclass
class ScriptedModel:
    """OpenAI-compatible chat completions that replay scripted turns, plus the feedback endpoints."""

    scripts: dict[str, list[Turn]] = field(default_factory=dict)
    refuse_status: int | None = None
    requests: list[tuple[dict[str, str], dict[str, Any]]] = field(default_factory=list)
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
        body = await request.json()
        self.requests.append((dict(request.headers), body))
        if self.refuse_status == 400:
            return JSONResponse({"error": {"message": "Could not find job", "code": 400}}, 400)
        if self.refuse_status is not None:
            return JSONResponse(
                {"error": {"message": "refused", "code": self.refuse_status}}, self.refuse_status
            )
        script = self.scripts[request.headers[TRAJECTORY_ID_HEADER]]
        turn = script.pop(0) if script else "I give up."
        return StreamingResponse(self._stream(turn), media_type="text/event-stream")

    async def report(self, request: Request) -> Response:
        self.reports.append((request.url.path, await request.json()))
        return JSONResponse({})

    @staticmethod
    def _stream(turn: Turn) -> Iterator[str]:
        def event(**fields: Any) -> str:
            base = {
                "id": "chatcmpl-scripted",
                "object": "chat.completion.chunk",
                "created": 0,
                "model": "default",
            }
            return f"data: {json.dumps({**base, **fields})}\n\n"

        def chunk(delta: dict[str, Any], finish: str | None = None) -> str:
            return event(choices=[{"index": 0, "delta": delta, "finish_reason": finish}])

        yield chunk({"role": "assistant", "content": ""})
        if isinstance(turn, str):
            yield chunk({"content": turn})
            yield chunk({}, "stop")
        else:
            for index, guess in enumerate(turn):
                call = {
                    "index": index,
                    "id": f"call_{index}",
                    "type": "function",
                    "function": {"name": "guess_word", "arguments": json.dumps({"guess": guess})},
                }
                yield chunk({"tool_calls": [call]})
            yield chunk({}, "tool_calls")
        yield event(choices=[], usage={"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15})
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
        port = self.server.servers[0].sockets[0].getsockname()[1]
        return f"http://127.0.0.1:{port}"

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
    with LoopbackServer(wordle_app) as url:
        yield url


def payload(rollout_id: str, endpoint: str, prompt: Any) -> dict[str, Any]:
    return {
        "prompt": prompt,
        "metadata": {"jobArn": JOB_ARN, "rolloutId": rollout_id, "endpoint": endpoint},
        "inferenceParams": {"temperature": 0.7, "maxTokens": 256},
    }


def invoke(agent_url: str, body: dict[str, Any]) -> httpx.Response:
    return httpx.post(f"{agent_url}/invocations", json=body, timeout=60)


def reports_for(scripted: ScriptedModel, rollout_id: str) -> dict[str, dict[str, Any]]:
    return {path: body for path, body in scripted.reports if body["TrajectoryId"] == rollout_id}


def test_a_won_game_over_real_sockets(model: tuple[ScriptedModel, str], agent_url: str) -> None:
    scripted, endpoint = model
    # Turn 1: an invalid word (refused, no guess spent) then a real guess, in one batch; turn 2 wins.
    scripted.scripts["win-1"] = [["zzzzz", "pilot"], ["crane"], "never requested"]
    response = invoke(agent_url, payload("win-1", endpoint, {"secret": "crane"}))
    assert response.status_code == 200, response.text
    result = response.json()
    expected = 1.05 + 0.09 * (6 - 2) + 0.05 / 2
    assert result["reward"] == pytest.approx(expected)
    assert result["metrics"] == {"solved": 1.0, "guesses": 2.0, "invalid_attempts": 1.0, "tool_calls": 3.0}
    reports = reports_for(scripted, "win-1")
    assert reports["/update-reward"]["Rewards"] == [pytest.approx(expected)]
    assert reports["/update-reward"]["JobArn"] == JOB_ARN
    assert reports["/complete-rollout"]["Status"] == "ready"

    # The winning guess ends the episode: no third model call; the scripted turn stays unused.
    assert len(scripted.requests) == 2
    assert scripted.scripts["win-1"] == ["never requested"]
    for headers, body in scripted.requests:
        assert headers[JOB_ARN_HEADER.lower()] == JOB_ARN
        assert headers[TRAJECTORY_ID_HEADER.lower()] == "win-1"
        assert body["stream"] is True and body["temperature"] == 0.7 and body["max_tokens"] == 256
        assert [tool["function"]["name"] for tool in body["tools"]] == ["guess_word"]
        assert "crane" not in json.dumps(body["messages"]).lower()
    # The second call carries the feedback of both tool calls, in the order they were made.
    tool_results = [m for m in scripted.requests[1][1]["messages"] if m["role"] == "tool"]
    texts = [json.dumps(m["content"]) for m in tool_results]
    assert "Invalid guess" in texts[0] and "you have 6 left" in texts[0]
    assert "Guess 1 of 6: PILOT" in texts[1] and "Guesses left: 5." in texts[1]


def test_concurrent_rollouts_keep_their_own_games(model: tuple[ScriptedModel, str], agent_url: str) -> None:
    scripted, endpoint = model
    misses = ["pilot", "ghost", "dumpy", "whisk", "fjord"]
    for n in range(1, 7):
        scripted.scripts[f"conc-{n}"] = [[word] for word in misses[: n - 1]] + [["crane"]]

    async def run_all() -> list[httpx.Response]:
        async with httpx.AsyncClient(base_url=agent_url, timeout=60) as client:
            bodies = [payload(f"conc-{n}", endpoint, {"secret": "crane"}) for n in range(1, 7)]
            return await asyncio.gather(*(client.post("/invocations", json=body) for body in bodies))

    responses = asyncio.run(run_all())
    for n, response in enumerate(responses, start=1):
        assert response.status_code == 200, response.text
        expected = 1.05 + 0.09 * (6 - n) + 0.05
        assert response.json()["reward"] == pytest.approx(expected)
        assert response.json()["metrics"]["guesses"] == n
        assert reports_for(scripted, f"conc-{n}")["/update-reward"]["Rewards"] == [pytest.approx(expected)]
    assert len(scripted.requests) == sum(range(1, 7))


def test_a_lost_game_in_process(model: tuple[ScriptedModel, str]) -> None:
    scripted, endpoint = model
    scripted.scripts["loss-1"] = [["pilot"], ["cream", "brave"], ["crate"], ["grace"], ["trace"], "more"]
    transport = httpx.ASGITransport(app=wordle_app)

    async def run() -> httpx.Response:
        async with httpx.AsyncClient(transport=transport, base_url="http://agent") as client:
            # The row may also arrive as a JSON string.
            body = payload("loss-1", endpoint, json.dumps({"secret": "crane"}))
            return await client.post("/invocations", json=body, timeout=60)

    response = asyncio.run(run())
    assert response.status_code == 200, response.text
    result = response.json()
    # Six valid guesses, all wrong; known: C, R, A, E green (positions 1-3, 5), nothing unplaced.
    expected = -0.5 + 0.2 * 4 / 5 + 0.05
    assert result["reward"] == pytest.approx(expected)
    assert result["metrics"]["solved"] == 0.0 and result["metrics"]["guesses"] == 6.0
    reports = reports_for(scripted, "loss-1")
    assert reports["/update-reward"]["Rewards"] == [pytest.approx(expected)]
    assert reports["/complete-rollout"]["Status"] == "ready"
    assert len(scripted.requests) == 5
    assert scripted.scripts["loss-1"] == ["more"]


def test_no_play_when_the_model_endpoint_answers_400_could_not_find_job(
    model: tuple[ScriptedModel, str], agent_url: str
) -> None:
    scripted, endpoint = model
    scripted.refuse_status = 400
    response = invoke(agent_url, payload("smoke-1", endpoint, {"secret": "crane"}))
    assert response.status_code == 200, response.text
    assert response.json()["reward"] == -1.5
    reports = reports_for(scripted, "smoke-1")
    assert reports["/update-reward"]["Rewards"] == [-1.5]
    assert reports["/complete-rollout"]["Status"] == "ready"
    assert len(scripted.requests) == 1


def test_an_infrastructure_error_fails_the_rollout_instead_of_scoring_it(
    model: tuple[ScriptedModel, str], agent_url: str
) -> None:
    scripted, endpoint = model
    scripted.refuse_status = 403
    response = invoke(agent_url, payload("denied-1", endpoint, {"secret": "crane"}))
    assert response.status_code == 500
    assert "PermissionDeniedError" in response.json()["error"]
    reports = reports_for(scripted, "denied-1")
    assert reports["/complete-rollout"]["Status"] == "failed"
    assert "/update-reward" not in reports


def test_a_model_that_stops_talking_loses_with_what_it_found(
    model: tuple[ScriptedModel, str], agent_url: str
) -> None:
    scripted, endpoint = model
    scripted.scripts["quit-1"] = [["pilot"], "I cannot think of another word."]
    response = invoke(agent_url, payload("quit-1", endpoint, {"secret": "crane"}))
    assert response.status_code == 200, response.text
    assert response.json()["reward"] == pytest.approx(-0.5 + 0.05)
    assert len(scripted.requests) == 2


def test_a_looping_model_is_stopped_by_the_tool_call_cap(
    model: tuple[ScriptedModel, str], agent_url: str
) -> None:
    scripted, endpoint = model
    scripted.scripts["loop-1"] = [["zzzzz", "qqqqq"]] * 15
    response = invoke(agent_url, payload("loop-1", endpoint, {"secret": "crane"}))
    assert response.status_code == 200, response.text
    result = response.json()
    assert result["metrics"]["tool_calls"] == 20.0 and result["metrics"]["guesses"] == 0.0
    assert result["reward"] == pytest.approx(-1.5 - 0.05 * (1 - 1 / 21))
    assert len(scripted.requests) == 10


def test_an_unknown_secret_is_refused_with_a_clear_error(
    model: tuple[ScriptedModel, str], agent_url: str
) -> None:
    scripted, endpoint = model
    response = invoke(agent_url, payload("bad-1", endpoint, {"secret": "qzxjv"}))
    assert response.status_code == 400
    assert "'qzxjv' is not a 5-letter word in the Wordle word list" in response.json()["error"]
    assert reports_for(scripted, "bad-1")["/complete-rollout"]["Status"] == "failed"
    assert scripted.requests == []
    response = invoke(agent_url, payload("bad-2", endpoint, {"word": "crane"}))
    assert response.status_code == 400
    assert 'like {"secret": "crane"}' in response.json()["error"]
