"""The gateway's HTTP routes (Starlette) over a :class:`~policy_server.server.PolicyServer`.

- ``POST /v1/chat/completions`` (JSON or SSE), ``GET /v1/models``, ``GET /health``
- ``POST /complete-rollout``, ``POST /update-reward``: the agent's reports (wire protocol)
- ``/admin/...``: the trainer's operations over HTTP (open/close job, open rollout, take trace,
  load adapter, counters), served only to the holder of the admin key; the trainer itself calls
  :class:`~policy_server.server.PolicyServer` in process, so by default they are not served at all

Each route is a module-level function reading the server from ``request.app.state.server``. Every
refusal is a 4xx with a sentence and every engine failure a 5xx with its message; the server keeps
serving (:mod:`policy_server.http.responses` shapes the bodies).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from handlers import (
    CHAT_COMPLETIONS_PATH,
    COMPLETE_ROLLOUT_PATH,
    JOB_ARN_HEADER,
    TRAJECTORY_ID_HEADER,
    UPDATE_REWARD_PATH,
    CompleteRolloutRequest,
    UpdateRewardRequest,
)
from policy_server.errors import EngineError, Rejection
from policy_server.http.auth import AuthMiddleware
from policy_server.http.bodies import (
    JobBody,
    LoadAdapterBody,
    OpenJobBody,
    RolloutBody,
    parse_model,
    read_body,
)
from policy_server.http.chat_api import ChatCompletionRequest, parse_request
from policy_server.http.chat_replies import CompletionIds, completion_body, stream_chunks
from policy_server.http.responses import ClientGone, error_response, sse, unless_disconnected

if TYPE_CHECKING:
    from policy_server.engines.base import GenerationResult
    from policy_server.server import PolicyServer


def _server(request: Request) -> PolicyServer:
    server: PolicyServer = request.app.state.server
    return server


async def _body(request: Request) -> bytes:
    return await read_body(request, _server(request).max_body_bytes)


async def chat_completions(request: Request) -> Response:
    server = _server(request)
    if server.inference_max_tokens is not None:
        return await _inference_call(request)
    job_arn = request.headers.get(JOB_ARN_HEADER)
    rollout_id = request.headers.get(TRAJECTORY_ID_HEADER)
    try:
        if not job_arn:
            raise Rejection(400, f"Missing header {JOB_ARN_HEADER}: every call must name its job.")
        server.registry.limits(job_arn)
        if not rollout_id:
            raise Rejection(400, f"Missing header {TRAJECTORY_ID_HEADER}: every call must name its rollout.")
        # Checked before the body is read, but an auto-opening job opens the rollout only once the
        # request is valid (in PolicyServer.complete).
        server.registry.check_rollout(job_arn, rollout_id)
        chat = parse_request(await _body(request))
        result = await unless_disconnected(request, server.complete(job_arn, rollout_id, chat))
    except Rejection as rejection:
        server.registry.reject_call(job_arn, rollout_id, rejection.status_code, rejection.message)
        return error_response(request.url.path, rejection.status_code, rejection.message)
    except EngineError as error:
        return error_response(request.url.path, 500, str(error))
    except ClientGone:
        return Response(status_code=499)  # nobody reads it; uvicorn drops it
    return _completion_response(server, chat, result)


async def _inference_call(request: Request) -> Response:
    """A call to an inference server (``rft serve --inference``): no job, no rollout, no trace."""
    server = _server(request)
    try:
        chat = parse_request(await _body(request))
        result = await unless_disconnected(request, server.infer(chat))
    except Rejection as rejection:
        return error_response(request.url.path, rejection.status_code, rejection.message)
    except EngineError as error:
        return error_response(request.url.path, 500, str(error))
    except ClientGone:
        return Response(status_code=499)
    return _completion_response(server, chat, result)


def _completion_response(
    server: PolicyServer, chat: ChatCompletionRequest, result: GenerationResult
) -> Response:
    ids = CompletionIds(server.policy_name)
    if not chat.stream:
        return JSONResponse(completion_body(result, ids, logprobs=chat.logprobs))
    include_usage = chat.stream_options is not None and chat.stream_options.include_usage
    chunks = stream_chunks(result, ids, include_usage=include_usage, logprobs=chat.logprobs)
    return StreamingResponse(sse(chunks), media_type="text/event-stream")


async def models(request: Request) -> Response:
    server = _server(request)
    entries = [
        {"id": name, "object": "model", "created": 0, "owned_by": "rftkit", "root": server.engine.model_name}
        for name in server.model_names
    ]
    return JSONResponse({"object": "list", "data": entries})


async def health(request: Request) -> Response:
    return JSONResponse({"status": "ok", "adapter_version": _server(request).current_adapter_version})


async def complete_rollout(request: Request) -> Response:
    report = parse_model(CompleteRolloutRequest, await _body(request))
    _server(request).complete_rollout(report.JobArn, report.TrajectoryId, report.Status)
    return JSONResponse({"status": "ok"})


async def update_reward(request: Request) -> Response:
    report = parse_model(UpdateRewardRequest, await _body(request))
    _server(request).update_reward(report.JobArn, report.TrajectoryId, report.Rewards)
    return JSONResponse({"status": "ok"})


async def open_job(request: Request) -> Response:
    body = parse_model(OpenJobBody, await _body(request))
    _server(request).open_job(
        body.job_arn,
        body.max_tokens,
        body.max_calls_per_rollout,
        body.auto_open_rollouts,
        body.max_open_rollouts,
    )
    return JSONResponse({"job_arn": body.job_arn})


async def close_job(request: Request) -> Response:
    body = parse_model(JobBody, await _body(request))
    return JSONResponse(_server(request).close_job(body.job_arn).model_dump())


async def open_rollout(request: Request) -> Response:
    body = parse_model(RolloutBody, await _body(request))
    _server(request).open_rollout(body.job_arn, body.rollout_id)
    return JSONResponse({"job_arn": body.job_arn, "rollout_id": body.rollout_id})


async def take_trace(request: Request) -> Response:
    body = parse_model(RolloutBody, await _body(request))
    return JSONResponse(_server(request).take_trace(body.job_arn, body.rollout_id).model_dump(mode="json"))


async def load_adapter(request: Request) -> Response:
    server = _server(request)
    body = parse_model(LoadAdapterBody, await _body(request))
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
    return JSONResponse(_server(request).counters(job_arn).model_dump())


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
    return error_response(request.url.path, exc.status_code, message.get(exc.status_code, str(exc.detail)))


async def on_unexpected(request: Request, exc: Exception) -> Response:
    return error_response(request.url.path, 500, f"Internal error: {type(exc).__name__}: {exc}")


ROUTES = [
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
]


def build_app(server: PolicyServer) -> Starlette:
    """The Starlette app for ``server``, behind its two credentials (:class:`AuthMiddleware`)."""
    app = Starlette(
        routes=ROUTES,
        exception_handlers={
            Rejection: on_rejection,
            EngineError: on_engine_error,
            HTTPException: on_http_error,
            Exception: on_unexpected,
        },
    )
    app.state.server = server
    app.add_middleware(
        AuthMiddleware,
        api_key=server.api_key,
        admin_key=server.admin_key,
        sagemaker_tokens=server.sagemaker_tokens,
        on_refusal=server.registry.reject_call,
    )
    return app
