"""Fixtures for the agent-side tests: a scripted OpenAI-compatible model server on loopback.

The model server is the one test double here (it stands in for the policy server, which has its own
tests): it records every call's headers and body and the feedback posts, and answers chat completions
from a script, streaming (as Strands calls it) or not.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack
from dataclasses import dataclass
from typing import Any

import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from handlers.protocol import JOB_ARN_HEADER, TRAJECTORY_ID_HEADER
from handlers.smoke_endpoint import serve_in_thread

# (request body, lower-cased request headers) -> the assistant's turn:
# {"content": "text"} or {"tool": "name", "arguments": {...}} (with optional "content").
Script = Callable[[dict[str, Any], dict[str, str]], dict[str, Any]]


@dataclass
class ModelCall:
    headers: dict[str, str]
    body: dict[str, Any]

    @property
    def rollout(self) -> tuple[str | None, str | None]:
        return self.headers.get(JOB_ARN_HEADER.lower()), self.headers.get(TRAJECTORY_ID_HEADER.lower())


class ScriptedModel:
    """A loopback OpenAI-compatible chat server plus the two feedback endpoints, recording everything."""

    def __init__(self) -> None:
        self.script: Script = lambda body, headers: {"content": "hello"}
        self.delay_s = 0.0
        self.calls: list[ModelCall] = []
        self.update_rewards: list[dict[str, Any]] = []
        self.complete_rollouts: list[dict[str, Any]] = []
        self.feedback_headers: list[dict[str, str]] = []
        self.in_flight = 0
        self.max_in_flight = 0
        self.url = ""

    def app(self) -> Starlette:
        return Starlette(
            routes=[
                Route("/v1/chat/completions", self._chat, methods=["POST"]),
                Route("/update-reward", self._record(self.update_rewards), methods=["POST"]),
                Route("/complete-rollout", self._record(self.complete_rollouts), methods=["POST"]),
            ]
        )

    def reports(self, rollout_id: str) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
        """The update-reward and complete-rollout bodies posted for one rollout."""
        rewards = [r for r in self.update_rewards if r["TrajectoryId"] == rollout_id]
        completions = [r for r in self.complete_rollouts if r["TrajectoryId"] == rollout_id]
        return rewards, completions

    def wait_for_reports(self, count: int, timeout_s: float = 5.0) -> None:
        deadline = time.monotonic() + timeout_s
        while len(self.complete_rollouts) < count and time.monotonic() < deadline:
            time.sleep(0.01)

    def _record(self, records: list[dict[str, Any]]) -> Callable[[Request], Any]:
        async def record(request: Request) -> Response:
            self.feedback_headers.append({key.lower(): value for key, value in request.headers.items()})
            records.append(await request.json())
            return JSONResponse({"status": "ok"})

        return record

    async def _chat(self, request: Request) -> Response:
        body = await request.json()
        headers = {key.lower(): value for key, value in request.headers.items()}
        self.calls.append(ModelCall(headers, body))
        self.in_flight += 1
        self.max_in_flight = max(self.max_in_flight, self.in_flight)
        try:
            await asyncio.sleep(self.delay_s)
        finally:
            self.in_flight -= 1
        turn = self.script(body, headers)
        if body.get("stream"):
            return StreamingResponse(self._stream(turn), media_type="text/event-stream")
        return JSONResponse(self._completion(turn))

    @staticmethod
    def _tool_call(turn: dict[str, Any]) -> dict[str, Any]:
        function = {"name": turn["tool"], "arguments": json.dumps(turn.get("arguments", {}))}
        return {"id": "call_0", "type": "function", "function": function}

    def _completion(self, turn: dict[str, Any]) -> dict[str, Any]:
        message: dict[str, Any] = {"role": "assistant", "content": turn.get("content") or None}
        if "tool" in turn:
            message["tool_calls"] = [self._tool_call(turn)]
        return {
            "id": "chatcmpl-0",
            "object": "chat.completion",
            "created": 0,
            "model": "default",
            "choices": [
                {"index": 0, "message": message, "finish_reason": "tool_calls" if "tool" in turn else "stop"}
            ],
            "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
        }

    def _stream(self, turn: dict[str, Any]) -> Iterator[str]:
        def event(choices: list[dict[str, Any]], **extra: Any) -> str:
            chunk = {"id": "chatcmpl-0", "object": "chat.completion.chunk", "created": 0, "model": "default"}
            return f"data: {json.dumps({**chunk, 'choices': choices, **extra})}\n\n"

        delta: dict[str, Any] = {"role": "assistant"}
        if turn.get("content"):
            delta["content"] = turn["content"]
        if "tool" in turn:
            delta["tool_calls"] = [{"index": 0, **self._tool_call(turn)}]
        yield event([{"index": 0, "delta": delta, "finish_reason": None}])
        finish = "tool_calls" if "tool" in turn else "stop"
        yield event([{"index": 0, "delta": {}, "finish_reason": finish}])
        yield event([], usage={"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2})
        yield "data: [DONE]\n\n"


@pytest.fixture
def model() -> Iterator[ScriptedModel]:
    """A scripted model server listening on 127.0.0.1 (free port) for the test's duration."""
    scripted = ScriptedModel()
    with serve_in_thread(scripted.app()) as url:
        scripted.url = url
        yield scripted


@pytest.fixture
def serve() -> Iterator[Callable[[Any], str]]:
    """Serve any ASGI app on 127.0.0.1 (free port) until the test ends; returns its base URL."""
    with ExitStack() as stack:
        yield lambda app: stack.enter_context(serve_in_thread(app))


def rollout_payload(
    rollout_id: str, endpoint: str | None, prompt: Any = "row", **extra: Any
) -> dict[str, Any]:
    """A valid rollout payload in the service's spelling."""
    metadata: dict[str, Any] = {
        "jobArn": "arn:aws:sagemaker:us-west-2:111122223333:training-job/t",
        "rolloutId": rollout_id,
    }
    if endpoint is not None:
        metadata["endpoint"] = endpoint
    return {"prompt": prompt, "metadata": metadata, **extra}


@pytest.fixture
def payload() -> Callable[..., dict[str, Any]]:
    return rollout_payload
