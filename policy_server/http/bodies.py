"""Reading request bodies: bounded in size and time, validated into pydantic models (400 with a
sentence), and the admin routes' body shapes."""

from __future__ import annotations

import asyncio
from typing import TypeVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError
from starlette.requests import Request

from policy_server.errors import Rejection
from policy_server.http.chat_api import describe_validation_error

ModelT = TypeVar("ModelT", bound=BaseModel)

# A client gets this long to send its whole body: a stalled upload must not hold a connection forever.
BODY_READ_TIMEOUT_S = 30.0


async def read_body(request: Request, limit: int, timeout_s: float | None = None) -> bytes:
    """The request body, refused with 413 as soon as it is known to exceed ``limit`` bytes, and with
    408 when it has not all arrived within ``timeout_s`` (default ``BODY_READ_TIMEOUT_S``)."""
    timeout_s = BODY_READ_TIMEOUT_S if timeout_s is None else timeout_s
    too_large = Rejection(413, f"The request body is larger than this server's limit of {limit} bytes.")
    declared = request.headers.get("content-length")
    if declared is not None:
        if not declared.isdigit():
            raise Rejection(400, "The Content-Length header is not a number.")
        if int(declared) > limit:
            raise too_large
    chunks, size = [], 0
    try:
        async with asyncio.timeout(timeout_s):
            async for chunk in request.stream():
                size += len(chunk)
                if size > limit:
                    raise too_large
                chunks.append(chunk)
    except TimeoutError:
        raise Rejection(408, f"The request body did not arrive within {timeout_s:g} s.") from None
    return b"".join(chunks)


def parse_model(model: type[ModelT], body: bytes) -> ModelT:
    try:
        return model.model_validate_json(body)
    except ValidationError as error:
        raise Rejection(400, describe_validation_error(error)) from None


class _AdminBody(BaseModel):
    model_config = ConfigDict(strict=True, extra="forbid")


class OpenJobBody(_AdminBody):
    job_arn: str = Field(min_length=1)
    max_tokens: int = Field(default=1024, ge=1)
    max_calls_per_rollout: int = Field(default=64, ge=1)
    auto_open_rollouts: bool = False
    max_open_rollouts: int = Field(default=1024, ge=1)


class JobBody(_AdminBody):
    job_arn: str = Field(min_length=1)


class RolloutBody(_AdminBody):
    job_arn: str = Field(min_length=1)
    rollout_id: str = Field(min_length=1)


class LoadAdapterBody(_AdminBody):
    path: str = Field(min_length=1, max_length=4096)
