"""The gateway's HTTP routes (Starlette) over a :class:`~policy_server.server.PolicyServer`.

- ``POST /v1/chat/completions`` (JSON or SSE), ``GET /v1/models``, ``GET /health``
- ``POST /complete-rollout``, ``POST /update-reward``: the agent's reports (wire protocol)
- ``/admin/...``: the trainer's operations over HTTP (open/close job, open rollout, take trace,
  load adapter, counters), served only to the holder of the admin key; the trainer itself calls
  :class:`~policy_server.server.PolicyServer` in process, so by default they are not served at all

Every refusal is a 4xx with a sentence and every engine failure a 5xx with its message; the server
keeps serving. Routes under ``/v1`` answer errors in OpenAI's shape,
``{"error": {"message", "type", "code"}}``, because OpenAI clients (and so Strands) surface only
``error.message``; the other routes answer ``{"error": "<sentence>"}``.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import json
from collections.abc import AsyncIterator, Coroutine
from typing import TYPE_CHECKING, Any, TypeVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route
from starlette.types import ASGIApp, Receive, Scope, Send

from handlers.protocol import (
    CHAT_COMPLETIONS_PATH,
    COMPLETE_ROLLOUT_PATH,
    JOB_ARN_HEADER,
    TRAJECTORY_ID_HEADER,
    UPDATE_REWARD_PATH,
    CompleteRolloutRequest,
    UpdateRewardRequest,
)
from policy_server.chat_api import (
    CompletionIds,
    completion_body,
    describe_validation_error,
    parse_request,
    stream_chunks,
)
from policy_server.jobs import Rejection
from policy_server.sigv4_token import SageMakerTokenPolicy

if TYPE_CHECKING:
    from policy_server.server import PolicyServer

ModelT = TypeVar("ModelT", bound=BaseModel)
ResultT = TypeVar("ResultT")


def error_response(path: str, status_code: int, message: str) -> JSONResponse:
    """The error body for a route: OpenAI's shape under /v1, a plain sentence elsewhere."""
    if path.startswith("/v1/"):
        kind = "invalid_request_error" if status_code < 500 else "server_error"
        body: dict[str, Any] = {"error": {"message": message, "type": kind, "code": status_code}}
    else:
        body = {"error": message}
    return JSONResponse(body, status_code=status_code)


ADMIN_PREFIX = "/admin/"

ADMIN_NOT_SERVED = (
    "Admin operations are not served over HTTP by this server: the trainer runs them in process. "
    "Start `rft serve` with --admin-key to serve them to the holder of that key."
)


def _bearer(scope: Scope) -> bytes:
    return dict(scope["headers"]).get(b"authorization", b"")


def _matches(given: bytes, key: str | None) -> bool:
    return key is not None and hmac.compare_digest(given, f"Bearer {key}".encode())


class AuthMiddleware:
    """Two credentials, two surfaces: the agents' key opens ``/v1/*``, the feedback routes and
    ``/health``; only the admin key opens ``/admin/*``, and without one ``/admin/*`` is not served.

    An agent holds whatever the trainer hands it, so its key must never reach the trainer's
    operations (close a job, take a trace, load an adapter).
    """

    def __init__(
        self,
        app: ASGIApp,
        api_key: str | None,
        admin_key: str | None,
        sagemaker_tokens: SageMakerTokenPolicy | None = None,
    ) -> None:
        self.app = app
        self.api_key = api_key
        self.admin_key = admin_key
        self.sagemaker_tokens = sagemaker_tokens

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            refusal = self._refusal(scope["path"], _bearer(scope))
            if refusal is not None:
                await error_response(scope["path"], *refusal)(scope, receive, send)
                return
        await self.app(scope, receive, send)

    def _refusal(self, path: str, given: bytes) -> tuple[int, str] | None:
        if path.startswith(ADMIN_PREFIX) or path == ADMIN_PREFIX.rstrip("/"):
            if self.admin_key is None:
                return 403, ADMIN_NOT_SERVED
            if _matches(given, self.admin_key):
                return None
            if _matches(given, self.api_key):
                return 403, "This is the agents' key: admin operations need the admin key."
            return 401, "Missing or wrong admin key: send the header 'Authorization: Bearer <admin key>'."
        if (self.api_key is None and self.sagemaker_tokens is None) or _matches(given, self.api_key):
            return None
        key_refusal = "Missing or wrong API key: send the header 'Authorization: Bearer <key>'."
        if self.sagemaker_tokens is None:
            return 401, key_refusal
        # The agents' routes also take the bearer tokens AWS's SageMaker SDK signs (checked offline).
        token_refusal = self.sagemaker_tokens.refusal(given.decode("latin-1"))
        if token_refusal is None:
            return None
        if self.api_key is None:
            return 401, f"SageMaker token refused: {token_refusal}."
        return 401, f"{key_refusal[:-1]}, or a SageMaker token (refused: {token_refusal})."


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


def _parse_model(model: type[ModelT], body: bytes) -> ModelT:
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


def _sse(chunks: list[dict[str, Any]]) -> AsyncIterator[bytes]:
    async def events() -> AsyncIterator[bytes]:
        for chunk in chunks:
            yield b"data: " + json.dumps(chunk, separators=(",", ":")).encode() + b"\n\n"
        yield b"data: [DONE]\n\n"

    return events()


class ClientGone(Exception):
    """The client closed its connection before its call finished."""


async def _unless_disconnected(request: Request, work: Coroutine[Any, Any, ResultT]) -> ResultT:
    """Run ``work``, cancelling it when the client disconnects (the body has been read by then).

    Cancelling the call lets the engine drop it (the hf engine at its next step, vLLM when the
    forwarded request's connection closes), so abandoned calls stop taking the engine's time.
    """
    task = asyncio.ensure_future(work)
    watcher = asyncio.ensure_future(_disconnected(request))
    try:
        await asyncio.wait({task, watcher}, return_when=asyncio.FIRST_COMPLETED)
    except asyncio.CancelledError:
        task.cancel()
        raise
    finally:
        watcher.cancel()
    if not task.done():
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await task
        raise ClientGone
    return task.result()


async def _disconnected(request: Request) -> None:
    while (await request.receive())["type"] != "http.disconnect":
        pass


def build_app(server: PolicyServer) -> Starlette:
    """The Starlette app for ``server``, behind its two credentials (:class:`AuthMiddleware`)."""
    from policy_server.server import EngineError

    async def chat_completions(request: Request) -> Response:
        job_arn = request.headers.get(JOB_ARN_HEADER)
        rollout_id = request.headers.get(TRAJECTORY_ID_HEADER)
        try:
            if not job_arn:
                raise Rejection(400, f"Missing header {JOB_ARN_HEADER}: every call must name its job.")
            server.registry.limits(job_arn)
            if not rollout_id:
                raise Rejection(
                    400, f"Missing header {TRAJECTORY_ID_HEADER}: every call must name its rollout."
                )
            # Checked before the body is read, but an auto-opening job opens the rollout only once
            # the request is valid (in PolicyServer.complete).
            server.registry.check_rollout(job_arn, rollout_id)
            chat = parse_request(await read_body(request, server.max_body_bytes))
            result = await _unless_disconnected(request, server.complete(job_arn, rollout_id, chat))
        except Rejection as rejection:
            server.registry.reject_call(job_arn, rollout_id)
            return error_response(request.url.path, rejection.status_code, rejection.message)
        except EngineError as error:
            return error_response(request.url.path, 500, str(error))
        except ClientGone:
            return Response(status_code=499)  # nobody reads it; uvicorn drops it
        ids = CompletionIds(server.policy_name)
        if not chat.stream:
            return JSONResponse(completion_body(result, ids))
        include_usage = chat.stream_options is not None and chat.stream_options.include_usage
        chunks = stream_chunks(result, ids, include_usage=include_usage)
        return StreamingResponse(_sse(chunks), media_type="text/event-stream")

    async def models(request: Request) -> Response:
        entries = [
            {
                "id": name,
                "object": "model",
                "created": 0,
                "owned_by": "rftkit",
                "root": server.engine.model_name,
            }
            for name in server.model_names
        ]
        return JSONResponse({"object": "list", "data": entries})

    async def health(request: Request) -> Response:
        return JSONResponse({"status": "ok", "adapter_version": server.current_adapter_version})

    async def complete_rollout(request: Request) -> Response:
        report = _parse_model(CompleteRolloutRequest, await read_body(request, server.max_body_bytes))
        server.complete_rollout(report.JobArn, report.TrajectoryId, report.Status)
        return JSONResponse({"status": "ok"})

    async def update_reward(request: Request) -> Response:
        report = _parse_model(UpdateRewardRequest, await read_body(request, server.max_body_bytes))
        server.update_reward(report.JobArn, report.TrajectoryId, report.Rewards)
        return JSONResponse({"status": "ok"})

    async def open_job(request: Request) -> Response:
        body = _parse_model(OpenJobBody, await read_body(request, server.max_body_bytes))
        server.open_job(
            body.job_arn,
            body.max_tokens,
            body.max_calls_per_rollout,
            body.auto_open_rollouts,
            body.max_open_rollouts,
        )
        return JSONResponse({"job_arn": body.job_arn})

    async def close_job(request: Request) -> Response:
        body = _parse_model(JobBody, await read_body(request, server.max_body_bytes))
        return JSONResponse(server.close_job(body.job_arn).model_dump())

    async def open_rollout(request: Request) -> Response:
        body = _parse_model(RolloutBody, await read_body(request, server.max_body_bytes))
        server.open_rollout(body.job_arn, body.rollout_id)
        return JSONResponse({"job_arn": body.job_arn, "rollout_id": body.rollout_id})

    async def take_trace(request: Request) -> Response:
        body = _parse_model(RolloutBody, await read_body(request, server.max_body_bytes))
        return JSONResponse(server.take_trace(body.job_arn, body.rollout_id).model_dump(mode="json"))

    async def load_adapter(request: Request) -> Response:
        body = _parse_model(LoadAdapterBody, await read_body(request, server.max_body_bytes))
        directory = server.admitted_adapter_path(body.path)
        try:
            version = await server.load_adapter(directory)
        except ValueError as error:
            raise Rejection(400, str(error)) from None
        except Exception as error:
            raise EngineError(
                f"The engine could not load {directory}: {type(error).__name__}: {error}"
            ) from error
        return JSONResponse({"version": version})

    async def counters(request: Request) -> Response:
        job_arn = request.query_params.get("job_arn")
        if not job_arn:
            raise Rejection(400, "Name the job: GET /admin/counters?job_arn=<arn>.")
        return JSONResponse(server.counters(job_arn).model_dump())

    async def on_rejection(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, Rejection)
        return error_response(request.url.path, exc.status_code, exc.message)

    async def on_engine_error(request: Request, exc: Exception) -> Response:
        return error_response(request.url.path, 500, str(exc))

    async def on_http_error(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, HTTPException)
        message = {
            404: f"No route {request.url.path}.",
            405: f"{request.method} is not allowed on {request.url.path}.",
        }
        return error_response(
            request.url.path, exc.status_code, message.get(exc.status_code, str(exc.detail))
        )

    async def on_unexpected(request: Request, exc: Exception) -> Response:
        return error_response(request.url.path, 500, f"Internal error: {type(exc).__name__}: {exc}")

    app = Starlette(
        routes=[
            Route(CHAT_COMPLETIONS_PATH, chat_completions, methods=["POST"]),
            Route("/v1/models", models, methods=["GET"]),
            Route("/health", health, methods=["GET"]),
            Route(COMPLETE_ROLLOUT_PATH, complete_rollout, methods=["POST"]),
            Route(UPDATE_REWARD_PATH, update_reward, methods=["POST"]),
            Route("/admin/open-job", open_job, methods=["POST"]),
            Route("/admin/close-job", close_job, methods=["POST"]),
            Route("/admin/open-rollout", open_rollout, methods=["POST"]),
            Route("/admin/take-trace", take_trace, methods=["POST"]),
            Route("/admin/load-adapter", load_adapter, methods=["POST"]),
            Route("/admin/counters", counters, methods=["GET"]),
        ],
        exception_handlers={
            Rejection: on_rejection,
            EngineError: on_engine_error,
            HTTPException: on_http_error,
            Exception: on_unexpected,
        },
    )
    app.add_middleware(
        AuthMiddleware,
        api_key=server.api_key,
        admin_key=server.admin_key,
        sagemaker_tokens=server.sagemaker_tokens,
    )
    return app
