"""``PayloadLimits``: what an agent app refuses before it parses a payload.

A rollout payload is a dataset row and a little metadata. The app would otherwise read any body into
memory and hand any nesting to Python's JSON parser, whose ``RecursionError`` it answers with a 500.
"""

from __future__ import annotations

import json

from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Message, Receive, Scope, Send

DEFAULT_MAX_PAYLOAD_BYTES = 8 * 1024 * 1024


class PayloadLimits:
    """ASGI middleware: a POST body over ``max_bytes`` answers 413, JSON nested too deeply 400."""

    def __init__(self, app: ASGIApp, max_bytes: int = DEFAULT_MAX_PAYLOAD_BYTES) -> None:
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] != "POST":
            await self.app(scope, receive, send)
            return
        too_large = JSONResponse(
            {"error": f"the payload is larger than this agent's limit of {self.max_bytes} bytes"},
            status_code=413,
        )
        declared = dict(scope["headers"]).get(b"content-length", b"")
        if declared.isdigit() and int(declared) > self.max_bytes:
            await too_large(scope, receive, send)
            return
        body = bytearray()
        while True:
            message = await receive()
            if message["type"] != "http.request":
                return  # the client left
            body += message.get("body", b"")
            if len(body) > self.max_bytes:
                await too_large(scope, receive, send)
                return
            if not message.get("more_body", False):
                break
        if _too_deep(bytes(body)):
            nested = JSONResponse(
                {"error": "the payload's JSON is nested too deeply to read"}, status_code=400
            )
            await nested(scope, receive, send)
            return
        await self.app(scope, _replay(bytes(body), receive), send)


def _too_deep(body: bytes) -> bool:
    try:
        json.loads(body)
    except RecursionError:
        return True
    except ValueError:  # not JSON at all: the app answers that itself
        return False
    return False


def _replay(body: bytes, receive: Receive) -> Receive:
    sent = False

    async def replay() -> Message:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()

    return replay
