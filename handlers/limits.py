"""``PayloadLimits``: what an agent app refuses before it parses a payload.

A rollout payload is a dataset row and a little metadata. The app would otherwise read any body into
memory, wait forever for a body that stops arriving, and hand any nesting to Python's JSON parser,
whose ``RecursionError`` it answers with a 500.
"""

from __future__ import annotations

import asyncio
import json

from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Message, Receive, Scope, Send

DEFAULT_MAX_PAYLOAD_BYTES = 8 * 1024 * 1024
# A caller gets this long to send a whole payload (the policy gateway gives its callers as long): a
# stalled upload must not hold a connection and a request slot of the agent forever.
DEFAULT_BODY_TIMEOUT_S = 30.0


class PayloadLimits:
    """ASGI middleware: a POST body over ``max_bytes`` answers 413, one not all sent within
    ``body_timeout_s`` 408, JSON nested too deeply 400."""

    def __init__(
        self,
        app: ASGIApp,
        max_bytes: int = DEFAULT_MAX_PAYLOAD_BYTES,
        body_timeout_s: float = DEFAULT_BODY_TIMEOUT_S,
    ) -> None:
        self.app = app
        self.max_bytes = max_bytes
        self.body_timeout_s = body_timeout_s

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
        try:
            async with asyncio.timeout(self.body_timeout_s):
                body = await self._read(receive)
        except TimeoutError:
            late = JSONResponse(
                {"error": f"the payload did not arrive within {self.body_timeout_s:g} s"}, status_code=408
            )
            await late(scope, receive, send)
            return
        if body is None:
            return  # the client left
        if len(body) > self.max_bytes:
            await too_large(scope, receive, send)
            return
        if _too_deep(body):
            nested = JSONResponse(
                {"error": "the payload's JSON is nested too deeply to read"}, status_code=400
            )
            await nested(scope, receive, send)
            return
        await self.app(scope, _replay(body, receive), send)

    async def _read(self, receive: Receive) -> bytes | None:
        """The whole body; None if the client left; stops reading once past ``max_bytes``."""
        body = bytearray()
        while True:
            message = await receive()
            if message["type"] != "http.request":
                return None
            body += message.get("body", b"")
            if len(body) > self.max_bytes or not message.get("more_body", False):
                return bytes(body)


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
