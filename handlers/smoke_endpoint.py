"""The policy endpoint ``rft smoke`` serves while it checks a local agent.

It serves no job: every model call is answered ``400 Could not find job`` (OpenAI's error shape), as
the real policy server answers for a job it does not know. The calls' headers and the feedback posts
are recorded so the check can tell what the agent did.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from handlers.protocol import (
    CHAT_COMPLETIONS_PATH,
    COMPLETE_ROLLOUT_PATH,
    JOB_NOT_FOUND_MESSAGE,
    UPDATE_REWARD_PATH,
)


@dataclass
class Recording:
    """What reached the smoke endpoint while the check ran."""

    model_call_headers: list[dict[str, str]] = field(default_factory=list)
    update_rewards: list[Any] = field(default_factory=list)
    complete_rollouts: list[Any] = field(default_factory=list)


def recording_app(recording: Recording) -> Starlette:
    """A policy endpoint that serves no job: model calls answer 400 ``Could not find job``."""

    async def chat_completions(request: Request) -> JSONResponse:
        recording.model_call_headers.append({key.lower(): value for key, value in request.headers.items()})
        error = {"message": JOB_NOT_FOUND_MESSAGE, "type": "invalid_request_error", "code": 400}
        return JSONResponse({"error": error}, status_code=400)

    def feedback(records: list[Any]) -> Any:
        async def record(request: Request) -> JSONResponse:
            try:
                records.append(await request.json())
            except ValueError:
                return JSONResponse({"error": "the body is not JSON"}, status_code=400)
            return JSONResponse({"status": "ok"})

        return record

    return Starlette(
        routes=[
            Route(CHAT_COMPLETIONS_PATH, chat_completions, methods=["POST"]),
            Route(UPDATE_REWARD_PATH, feedback(recording.update_rewards), methods=["POST"]),
            Route(COMPLETE_ROLLOUT_PATH, feedback(recording.complete_rollouts), methods=["POST"]),
        ]
    )
