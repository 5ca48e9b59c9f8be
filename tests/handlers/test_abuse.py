"""Abuse of the agent side: payloads the app must refuse with a 400/408/413 (not a 500), and model
clients that stop by the rollout's deadline and never follow a redirect off the endpoint."""

from __future__ import annotations

import asyncio
import socket
import threading
import time
from collections.abc import Iterator
from typing import Any

import httpx
import openai
import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, RedirectResponse, Response
from starlette.routing import Route
from starlette.testclient import TestClient

from handlers import RolloutContext, rft_app
from handlers.protocol import RolloutPayload
from handlers.serving import serve_in_thread

JOB = "arn:aws:sagemaker:us-west-2:111122223333:training-job/abuse"


def _payload(endpoint: str | None = "http://127.0.0.1:9", **rftkit: Any) -> dict[str, Any]:
    metadata: dict[str, Any] = {"jobArn": JOB, "rolloutId": "r1"}
    if endpoint is not None:
        metadata["endpoint"] = endpoint
    return {"prompt": "row", "metadata": metadata, "rftkit": rftkit}


def _calls_the_model(row: Any, ctx: RolloutContext) -> float:
    ctx.openai_client()
    return 1.0


@pytest.fixture
def agent() -> Iterator[TestClient]:
    with TestClient(rft_app(_calls_the_model, max_payload_bytes=1024 * 1024)) as client:
        yield client


@pytest.mark.parametrize(
    ("body", "status", "words"),
    [
        (b'{"prompt": ' + b"[" * 100_000 + b"]" * 100_000 + b"}", 400, "nested too deeply"),
        (b'{"prompt": "' + b"x" * (2 * 1024 * 1024) + b'"}', 413, "larger than this agent's limit"),
    ],
    ids=["deep-json", "huge-body"],
)
def test_payloads_too_deep_or_too_large_are_refused(
    agent: TestClient, body: bytes, status: int, words: str
) -> None:
    answer = agent.post("/invocations", content=body, headers={"content-type": "application/json"})
    assert answer.status_code == status and words in answer.json()["error"]


def test_a_body_without_content_length_is_bounded_too(agent: TestClient) -> None:
    def chunks() -> Iterator[bytes]:
        for _ in range(64):
            yield b"x" * 65536

    answer = agent.post("/invocations", content=chunks(), headers={"content-type": "application/json"})
    assert answer.status_code == 413


def _read_response(sock: socket.socket) -> str:
    """One whole HTTP response (headers and a Content-Length body) from a raw socket."""
    data = b""
    while b"\r\n\r\n" not in data:
        data += sock.recv(65536)
    head, _, body = data.partition(b"\r\n\r\n")
    length = next(
        int(line.split(b":", 1)[1])
        for line in head.split(b"\r\n")
        if line.lower().startswith(b"content-length:")
    )
    while len(body) < length:
        body += sock.recv(65536)
    return (head + b"\r\n\r\n" + body).decode()


def test_a_body_that_stops_arriving_answers_408_and_the_app_keeps_serving() -> None:
    """Content-Length 500 and 20 bytes sent: 408 once the body timeout passes, not a held connection."""
    app = rft_app(_calls_the_model, body_timeout_s=1.0)
    with serve_in_thread(app) as url:
        host, port = url.removeprefix("http://").split(":")
        with socket.create_connection((host, int(port)), timeout=30) as sock:
            sock.sendall(
                b"POST /invocations HTTP/1.1\r\nHost: agent\r\nContent-Type: application/json\r\n"
                b"Content-Length: 500\r\n\r\n" + b'{"prompt": "row", "x'
            )
            answer = _read_response(sock)
        assert answer.startswith("HTTP/1.1 408") and "did not arrive within 1 s" in answer
        with httpx.Client(base_url=url) as client:
            assert client.post("/invocations", json=_payload()).status_code == 200


@pytest.mark.parametrize(
    "endpoint",
    ["http://127.0.0.1\r\n:9000", "http://127.0.0.1:99999", "http://:80", "http://a b:80"],
)
def test_malformed_endpoints_answer_400(agent: TestClient, endpoint: str) -> None:
    answer = agent.post("/invocations", json=_payload(endpoint))
    assert answer.status_code == 400 and "metadata.endpoint" in answer.json()["error"]


def test_a_missing_endpoint_answers_400(agent: TestClient) -> None:
    answer = agent.post("/invocations", json=_payload(None))
    assert answer.status_code == 400 and "metadata.endpoint" in answer.json()["error"]


@pytest.fixture(scope="module")
def stalled_and_redirecting() -> Iterator[tuple[str, list[str]]]:
    """A model endpoint that answers slowly, or redirects every call elsewhere (recorded there)."""
    reached: list[str] = []
    release = threading.Event()

    async def slow(request: Request) -> Response:
        await asyncio.to_thread(release.wait, 30)
        return JSONResponse({"error": "too late"}, status_code=500)

    async def elsewhere(request: Request) -> Response:
        reached.append(request.url.path)
        return JSONResponse({"error": "should never be reached"}, status_code=500)

    with serve_in_thread(Starlette(routes=[Route("/{path:path}", elsewhere, methods=["POST"])])) as other:

        async def redirect(request: Request) -> Response:
            return RedirectResponse(f"{other}/v1/chat/completions", status_code=307)

        app = Starlette(
            routes=[
                Route("/slow/v1/chat/completions", slow, methods=["POST"]),
                Route("/redirect/v1/chat/completions", redirect, methods=["POST"]),
            ]
        )
        with serve_in_thread(app) as url:
            yield url, reached
        release.set()


def _context(endpoint: str, **rftkit: Any) -> RolloutContext:
    return RolloutContext(RolloutPayload.model_validate(_payload(endpoint, **rftkit)), "row")


def test_model_calls_end_by_the_rollouts_deadline(stalled_and_redirecting: tuple[str, list[str]]) -> None:
    url, _ = stalled_and_redirecting
    ctx = _context(f"{url}/slow", timeout_s=1.5)
    messages: Any = [{"role": "user", "content": "hi"}]
    started = time.monotonic()
    with pytest.raises(openai.APITimeoutError), ctx.openai_client() as client:
        client.chat.completions.create(model="default", messages=messages)
    assert time.monotonic() - started < 5  # one attempt within the deadline, no retry after it

    async def strands_call() -> None:
        from strands import Agent

        agent = Agent(model=_context(f"{url}/slow", timeout_s=1.5).strands_model(), callback_handler=None)
        await agent.invoke_async("hi")

    started = time.monotonic()
    with pytest.raises(Exception):  # noqa: B017 - Strands wraps the timeout in its own error types
        asyncio.run(strands_call())
    assert time.monotonic() - started < 5
    # Without a deadline in the payload the timeout is still bounded, far below the libraries' 600 s.
    assert _context(url).client_args()["timeout"].read <= 120


def test_clients_never_follow_a_redirect_off_the_endpoint(
    stalled_and_redirecting: tuple[str, list[str]],
) -> None:
    url, reached = stalled_and_redirecting
    ctx = _context(f"{url}/redirect", timeout_s=20)
    messages: Any = [{"role": "user", "content": "hi"}]
    with pytest.raises(openai.APIStatusError) as sync_error, ctx.openai_client() as client:
        client.chat.completions.create(model="default", messages=messages)
    assert sync_error.value.status_code == 307

    async def async_call() -> None:
        async with ctx.async_openai_client() as client:
            await client.chat.completions.create(model="default", messages=messages)

    with pytest.raises(openai.APIStatusError):
        asyncio.run(async_call())

    async def strands_call() -> None:
        from strands import Agent

        await Agent(model=ctx.strands_model(), callback_handler=None).invoke_async("hi")

    with pytest.raises(Exception):  # noqa: B017
        asyncio.run(strands_call())
    assert reached == []
