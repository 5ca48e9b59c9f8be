"""How the gateway answers: errors in the shape each route's clients read, SSE streams, and calls
cancelled when their client leaves.

Routes under ``/v1`` answer errors in OpenAI's shape, ``{"error": {"message", "type", "code"}}``,
because OpenAI clients (and so Strands) surface only ``error.message``; the other routes answer
``{"error": "<sentence>"}``.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator, Coroutine
from typing import Any, TypeVar

from starlette.requests import Request
from starlette.responses import JSONResponse

ResultT = TypeVar("ResultT")


def error_response(path: str, status_code: int, message: str) -> JSONResponse:
    """The error body for a route: OpenAI's shape under /v1, a plain sentence elsewhere."""
    if path.startswith("/v1/"):
        kind = "invalid_request_error" if status_code < 500 else "server_error"
        body: dict[str, Any] = {"error": {"message": message, "type": kind, "code": status_code}}
    else:
        body = {"error": message}
    return JSONResponse(body, status_code=status_code)


def sse(chunks: list[dict[str, Any]]) -> AsyncIterator[bytes]:
    async def events() -> AsyncIterator[bytes]:
        for chunk in chunks:
            yield b"data: " + json.dumps(chunk, separators=(",", ":")).encode() + b"\n\n"
        yield b"data: [DONE]\n\n"

    return events()


class ClientGone(Exception):
    """The client closed its connection before its call finished."""


async def unless_disconnected(request: Request, work: Coroutine[Any, Any, ResultT]) -> ResultT:
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
