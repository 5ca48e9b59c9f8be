"""The link between gateway worker processes and the process that holds the job state.

With several gateway workers, the trainer's process keeps the one :class:`~policy_server.jobs.JobRegistry`
and the adapter versions; each worker reaches them over a Unix socket in a directory only this user
can open. A message is a 4-byte length and a pickle of ``(method, args, wants_reply)``; a reply is
``("ok", value)``, ``("rejection", status, message)``, ``("value_error", message)`` or
``("error", message)``. Pickle is safe here because both ends are rftkit's own processes and the
socket's directory is private (mode 0700); the methods a worker may call are a fixed table.

The worker side is blocking on purpose: a round trip on a local socket costs tens of microseconds,
less than scheduling a coroutine, and the registry's own methods are synchronous.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import pickle
import socket
import struct
import threading
from collections.abc import Awaitable, Callable
from typing import Any

from policy_server.errors import Rejection

logger = logging.getLogger(__name__)

_LENGTH = struct.Struct("!I")

Handler = Callable[..., Any | Awaitable[Any]]


class StateLinkError(RuntimeError):
    """The process holding the job state failed on a request or cannot be reached."""


def _frame(message: object) -> bytes:
    payload = pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)
    return _LENGTH.pack(len(payload)) + payload


class StateClient:
    """A worker's blocking connection to the state process; one request at a time (a lock)."""

    def __init__(self, path: str) -> None:
        self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._sock.connect(path)
        self._lock = threading.Lock()

    def call(self, method: str, *args: Any) -> Any:
        """Run ``method`` in the state process and return its result (re-raising its refusal)."""
        with self._lock:
            try:
                self._sock.sendall(_frame((method, args, True)))
                reply = pickle.loads(self._read(_LENGTH.unpack(self._read(_LENGTH.size))[0]))
            except OSError as error:
                raise StateLinkError(f"The gateway's state process is unreachable: {error}") from error
        kind = reply[0]
        if kind == "ok":
            return reply[1]
        if kind == "rejection":
            raise Rejection(reply[1], reply[2])
        if kind == "value_error":
            raise ValueError(reply[1])
        raise StateLinkError(f"The gateway's state process failed on {method}: {reply[1]}")

    def send(self, method: str, *args: Any) -> None:
        """Run ``method`` in the state process without waiting for it (it answers nothing)."""
        with self._lock:
            try:
                self._sock.sendall(_frame((method, args, False)))
            except OSError as error:
                raise StateLinkError(f"The gateway's state process is unreachable: {error}") from error

    def _read(self, size: int) -> bytes:
        chunks, left = [], size
        while left:
            chunk = self._sock.recv(left)
            if not chunk:
                raise ConnectionResetError("the state process closed the connection")
            chunks.append(chunk)
            left -= len(chunk)
        return b"".join(chunks)

    def close(self) -> None:
        self._sock.close()


async def serve_link(
    reader: asyncio.StreamReader, writer: asyncio.StreamWriter, handlers: dict[str, Handler]
) -> None:
    """Answer one worker connection's requests in order until it closes."""
    try:
        while True:
            try:
                (size,) = _LENGTH.unpack(await reader.readexactly(_LENGTH.size))
                method, args, wants_reply = pickle.loads(await reader.readexactly(size))
            except (asyncio.IncompleteReadError, ConnectionError):
                return
            reply = await _answer(handlers, method, args)
            if wants_reply:
                writer.write(_frame(reply))
    finally:
        writer.close()


async def _answer(handlers: dict[str, Handler], method: str, args: tuple[Any, ...]) -> tuple[Any, ...]:
    handler = handlers.get(method)
    if handler is None:
        return ("error", f"no method {method!r}")
    try:
        value = handler(*args)
        if inspect.isawaitable(value):
            value = await value
    except Rejection as rejection:
        return ("rejection", rejection.status_code, rejection.message)
    except ValueError as error:
        return ("value_error", str(error))
    except Exception as error:
        logger.exception("the state process failed on %s", method)
        return ("error", f"{type(error).__name__}: {error}")
    return ("ok", value)
