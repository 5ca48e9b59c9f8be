"""The one scripted fake model server of the suite: it stands in for the policy server in the agent tests.

It answers OpenAI chat completions, streamed as Strands asks for them (SSE) or as JSON, with turns
from a script, and records every call's headers and body and every feedback post. It also answers
the two routes a vLLM server scores given tokens with (an endpoint teacher of distillation):
``/v1/completions`` with ``prompt_logprobs`` for token-id prompts, and ``/tokenize``. Turns are chosen
per rollout (by the trajectory-id header) from ``scripts``, or by the ``script`` function.

A turn is ``{"content": "text"}``, or tool calls: ``{"tool": name, "arguments": {...}}`` for one call,
``{"calls": [{"tool": ..., "arguments": ...}, ...]}`` for several in one assistant message (either
with an optional ``"content"``).
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from handlers.protocol import (
    CHAT_COMPLETIONS_PATH,
    COMPLETE_ROLLOUT_PATH,
    JOB_ARN_HEADER,
    JOB_NOT_FOUND_MESSAGE,
    TRAJECTORY_ID_HEADER,
    UPDATE_REWARD_PATH,
)

Turn = dict[str, Any]
# (request body, lower-cased request headers) -> the assistant's turn
Script = Callable[[dict[str, Any], dict[str, str]], Turn]


def text(content: str) -> Turn:
    return {"content": content}


def tool(name: str, **arguments: Any) -> Turn:
    return {"tool": name, "arguments": arguments}


def tools(*calls: Turn) -> Turn:
    """Several tool calls in one assistant message."""
    return {"calls": list(calls)}


@dataclass
class ModelCall:
    headers: dict[str, str]
    body: dict[str, Any]

    @property
    def rollout(self) -> tuple[str | None, str | None]:
        return self.headers.get(JOB_ARN_HEADER.lower()), self.headers.get(TRAJECTORY_ID_HEADER.lower())


class ScriptedModel:
    """A loopback OpenAI-compatible chat server plus the two feedback endpoints, recording everything."""

    def __init__(self, default_turn: Turn | None = None) -> None:
        self.scripts: dict[str, list[Turn]] = {}
        self.default_turn = default_turn or text("hello")
        self.script: Script = self._next_scripted_turn
        # 400 answers "Could not find job" (a job the server does not know); other codes "refused".
        self.refuse_status: int | None = None
        self.delay_s = 0.0
        self.calls: list[ModelCall] = []
        self.update_rewards: list[dict[str, Any]] = []
        self.complete_rollouts: list[dict[str, Any]] = []
        self.feedback_headers: list[dict[str, str]] = []
        self.in_flight = 0
        self.max_in_flight = 0
        self.url = ""
        # The scoring routes: /tokenize answers ``tokenize(text)`` (unset: 404, as a server without the
        # route), /v1/completions every prompt token's ``prompt_logprob(token, position)``; ``queued``
        # (status, body) answers go out first on either, in order; ``scoring`` records their calls.
        self.tokenize: Callable[[str], list[int]] | None = None
        self.prompt_logprob: Callable[[int, int], float] = lambda token, position: -0.01 * (token % 50) - 0.1
        self.queued: list[tuple[int, bytes]] = []
        self.scoring: list[ModelCall] = []

    def app(self) -> Starlette:
        return Starlette(
            routes=[
                Route(CHAT_COMPLETIONS_PATH, self._chat, methods=["POST"]),
                Route("/v1/completions", self._score, methods=["POST"]),
                Route("/tokenize", self._tokenize, methods=["POST"]),
                Route(UPDATE_REWARD_PATH, self._record(self.update_rewards), methods=["POST"]),
                Route(COMPLETE_ROLLOUT_PATH, self._record(self.complete_rollouts), methods=["POST"]),
            ]
        )

    def bodies(self, rollout_id: str) -> list[dict[str, Any]]:
        """The chat request bodies one rollout sent, in order."""
        return [call.body for call in self.calls if call.rollout[1] == rollout_id]

    def reports(self, rollout_id: str) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
        """The update-reward and complete-rollout bodies posted for one rollout."""
        rewards = [r for r in self.update_rewards if r["TrajectoryId"] == rollout_id]
        completions = [r for r in self.complete_rollouts if r["TrajectoryId"] == rollout_id]
        return rewards, completions

    def feedback(self, rollout_id: str) -> dict[str, dict[str, Any]]:
        """The last feedback body per path (``/update-reward``, ``/complete-rollout``) of one rollout."""
        rewards, completions = self.reports(rollout_id)
        found = {UPDATE_REWARD_PATH: rewards[-1:], COMPLETE_ROLLOUT_PATH: completions[-1:]}
        return {path: bodies[0] for path, bodies in found.items() if bodies}

    def wait_for_reports(self, count: int, timeout_s: float = 5.0) -> None:
        deadline = time.monotonic() + timeout_s
        while len(self.complete_rollouts) < count and time.monotonic() < deadline:
            time.sleep(0.01)

    def _next_scripted_turn(self, body: dict[str, Any], headers: dict[str, str]) -> Turn:
        script = self.scripts.get(headers.get(TRAJECTORY_ID_HEADER.lower(), ""))
        return script.pop(0) if script else self.default_turn

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
        if self.refuse_status is not None:
            message = JOB_NOT_FOUND_MESSAGE if self.refuse_status == 400 else "refused"
            error = {"message": message, "type": "invalid_request_error", "code": self.refuse_status}
            return JSONResponse({"error": error}, self.refuse_status)
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

    async def _scoring_call(self, request: Request) -> tuple[dict[str, Any], Response | None]:
        """The call's body, recorded; and the next queued answer (after ``delay_s``), if any."""
        body = await request.json()
        self.scoring.append(ModelCall({key.lower(): value for key, value in request.headers.items()}, body))
        await asyncio.sleep(self.delay_s)
        if self.queued:
            status, content = self.queued.pop(0)
            return body, Response(content, status, media_type="application/json")
        return body, None

    async def _tokenize(self, request: Request) -> Response:
        body, queued = await self._scoring_call(request)
        if queued is not None:
            return queued
        if self.tokenize is None:
            return JSONResponse({"detail": "Not Found"}, 404)
        tokens = self.tokenize(body["prompt"])
        return JSONResponse({"count": len(tokens), "max_model_len": 2048, "tokens": tokens})

    async def _score(self, request: Request) -> Response:
        body, queued = await self._scoring_call(request)
        if queued is not None:
            return queued
        prompts = body["prompt"] if isinstance(body["prompt"][0], list) else [body["prompt"]]
        choices = [
            {
                "index": index,
                "text": "x",
                "finish_reason": "length",
                "prompt_logprobs": [None]
                + [
                    {str(token): {"logprob": self.prompt_logprob(token, position), "rank": 1}}
                    for position, token in enumerate(prompt[1:], start=1)
                ],
            }
            for index, prompt in enumerate(prompts)
        ]
        tokens = sum(len(prompt) for prompt in prompts)
        usage = {
            "prompt_tokens": tokens,
            "completion_tokens": len(prompts),
            "total_tokens": tokens + len(prompts),
        }
        return JSONResponse(
            {"object": "text_completion", "model": body["model"], "choices": choices, "usage": usage}
        )

    @staticmethod
    def _tool_calls(turn: Turn) -> list[dict[str, Any]]:
        calls = turn.get("calls") or ([turn] if "tool" in turn else [])
        return [
            {
                "id": f"call_{index}",
                "type": "function",
                "function": {"name": call["tool"], "arguments": json.dumps(call.get("arguments", {}))},
            }
            for index, call in enumerate(calls)
        ]

    def _completion(self, turn: Turn) -> dict[str, Any]:
        message: dict[str, Any] = {"role": "assistant", "content": turn.get("content") or None}
        calls = self._tool_calls(turn)
        if calls:
            message["tool_calls"] = calls
        return {
            "id": "chatcmpl-0",
            "object": "chat.completion",
            "created": 0,
            "model": "default",
            "choices": [{"index": 0, "message": message, "finish_reason": "tool_calls" if calls else "stop"}],
            "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
        }

    def _stream(self, turn: Turn) -> Iterator[str]:
        def event(choices: list[dict[str, Any]], **extra: Any) -> str:
            chunk = {"id": "chatcmpl-0", "object": "chat.completion.chunk", "created": 0, "model": "default"}
            return f"data: {json.dumps({**chunk, 'choices': choices, **extra})}\n\n"

        delta: dict[str, Any] = {"role": "assistant"}
        if turn.get("content"):
            delta["content"] = turn["content"]
        calls = self._tool_calls(turn)
        if calls:
            delta["tool_calls"] = [{"index": index, **call} for index, call in enumerate(calls)]
        yield event([{"index": 0, "delta": delta, "finish_reason": None}])
        yield event([{"index": 0, "delta": {}, "finish_reason": "tool_calls" if calls else "stop"}])
        yield event([], usage={"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2})
        yield "data: [DONE]\n\n"
