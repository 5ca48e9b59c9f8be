"""A server stopped with requests still running (a run that ends with rollouts in flight) is quiet and
clean: each unfinished request answers 503 with a sentence, and no CancelledError traceback is logged."""

from __future__ import annotations

import asyncio
import threading
import time

import httpx
import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from handlers.serving import ServingThread


async def _slow(request: Request) -> Response:
    await asyncio.sleep(60)
    return JSONResponse({})


def test_stopping_with_requests_in_flight_answers_503_without_tracebacks(
    capfd: pytest.CaptureFixture[str],
) -> None:
    server = ServingThread(Starlette(routes=[Route("/slow", _slow)])).start()
    answers: list[httpx.Response] = []
    clients = [
        threading.Thread(target=lambda: answers.append(httpx.get(f"{server.url}/slow", timeout=60)))
        for _ in range(3)
    ]
    for client in clients:
        client.start()
    time.sleep(0.5)
    server.stop()
    for client in clients:
        client.join(30)

    assert [answer.status_code for answer in answers] == [503] * 3
    assert "shutting down" in answers[0].json()["error"]["message"]
    output = capfd.readouterr()
    assert "Traceback" not in output.err + output.out and "CancelledError" not in output.err + output.out
