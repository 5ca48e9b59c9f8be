"""Serve an ASGI app with uvicorn from a background thread: the one way rftkit does it.

Used by the policy server (``policy_server.running.ServerThread`` adds its engine to the thread's
event loop), the metrics port, ``rft smoke``'s recording endpoint, the soak benchmark and the tests.
It binds the socket itself, so port 0 gives a free port known before the first request, and sets
TCP_NODELAY on it.
"""

from __future__ import annotations

import asyncio
import socket
import sys
import threading
import time
from collections.abc import Awaitable, Callable, Coroutine, Iterator
from concurrent.futures import Future, wait
from contextlib import contextmanager
from typing import Any, TypeVar

import uvicorn
from starlette.types import ASGIApp, Message, Receive, Scope, Send
from uvicorn.protocols.http.auto import AutoHTTPProtocol

from handlers.loop_thread import LoopThread

ResultT = TypeVar("ResultT")

START_TIMEOUT_S = 120.0
# Uvicorn's graceful shutdown (5 s) plus closing what the thread started; past this, stop() gives up
# waiting (the thread is a daemon and ends with the process), so Ctrl-C always stops a server.
STOP_TIMEOUT_S = 30.0
# A connection gets this long to send a request's headers (a body has its own limit where it is read).
# Without it a stalled socket is held forever, and enough of them exhaust the process's file handles.
# Longer than clients keep idle connections (httpx: 5 s), so no call leaves on a closing connection.
HEADER_TIMEOUT_S = 10.0
# Connections served at once; past it uvicorn answers 503 rather than taking more file handles.
MAX_CONNECTIONS = 2048

# Longer than clients keep idle connections (httpx, so the OpenAI client and Strands: 5 s). With
# uvicorn's default of 5 s both ends close at once, and a call sent on a connection the server is
# closing fails with a read error (bench/soak.py shows it on a loaded machine).
KEEP_ALIVE_S = 65

Hook = Callable[[], Awaitable[None]]


def protocol_with_header_timeout(timeout_s: float) -> type[asyncio.Protocol]:
    """uvicorn's HTTP protocol, closing a connection that sends no complete request headers in time."""
    base: Any = AutoHTTPProtocol

    class HeaderTimeoutProtocol(base):
        _header_timer: asyncio.TimerHandle | None = None

        def connection_made(self, transport: asyncio.Transport) -> None:
            super().connection_made(transport)
            self._arm()

        def on_response_complete(self) -> None:
            super().on_response_complete()
            self._arm()  # the next request on this connection gets the same deadline

        def connection_lost(self, exc: Exception | None) -> None:
            if self._header_timer is not None:
                self._header_timer.cancel()
            super().connection_lost(exc)

        def _arm(self) -> None:
            if self._header_timer is not None:
                self._header_timer.cancel()
            self._header_timer = self.loop.call_later(timeout_s, self._close_if_no_request)

        def _close_if_no_request(self) -> None:
            waiting = self.cycle is None or self.cycle.response_complete
            if waiting and not self.transport.is_closing():
                self.transport.close()

    return HeaderTimeoutProtocol


class ServingThread:
    """Serve ``app`` on ``host:port`` from a background thread with its own event loop.

    ``on_start`` runs on that loop before uvicorn listens and ``on_stop`` after it stops (the policy
    server starts and closes its engine there, so the engine lives on the loop that serves calls).
    """

    def __init__(
        self,
        app: ASGIApp,
        host: str = "127.0.0.1",
        port: int = 0,
        *,
        log_level: str = "warning",
        on_start: Hook | None = None,
        on_stop: Hook | None = None,
        name: str = "server",
        header_timeout_s: float = HEADER_TIMEOUT_S,
    ) -> None:
        self.app = app
        self.header_timeout_s = header_timeout_s
        self.host = host
        self.port = port
        self.log_level = log_level
        self.name = name
        self._on_start = on_start
        self._on_stop = on_stop
        self._uvicorn: uvicorn.Server | None = None
        self._thread: LoopThread | None = None
        self._serving: Future[None] | None = None
        self._ready = threading.Event()
        self._hooks_done = threading.Event()
        self._failure: BaseException | None = None

    @property
    def url(self) -> str:
        """Base URL of the server (no trailing slash)."""
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}"

    def start(self) -> ServingThread:
        """Run ``on_start`` and uvicorn; return once the socket is listening."""
        if self._thread is not None:
            raise RuntimeError("This server thread was already started; make a new one.")
        family = socket.AF_INET6 if ":" in self.host else socket.AF_INET
        sock = socket.socket(family, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        # Accepted connections inherit this. Without it, Nagle's algorithm meets the client's delayed
        # ACK and every call stalls for the ACK timer (docs/benchmarks.md has the measurement).
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        try:
            sock.bind((self.host, self.port))
        except OSError:
            sock.close()
            raise
        self.port = sock.getsockname()[1]
        config = uvicorn.Config(
            QuietShutdown(self.app, lambda: self._uvicorn is not None and self._uvicorn.should_exit),
            log_level=self.log_level,
            lifespan="off",
            timeout_graceful_shutdown=5,
            timeout_keep_alive=KEEP_ALIVE_S,
            http=protocol_with_header_timeout(self.header_timeout_s),
            limit_concurrency=MAX_CONNECTIONS,
        )
        self._uvicorn = uvicorn.Server(config)
        self._thread = LoopThread(self.name).start()
        self._serving = self._thread.submit(self._main(sock))
        self._serving.add_done_callback(lambda done: self._ended(done, sock))
        self._wait_ready()
        if self._failure is not None:
            self._thread.stop()
            raise RuntimeError(f"The {self.name} failed to start: {self._failure}") from self._failure
        if not self._ready.is_set():
            raise TimeoutError(f"The {self.name} did not start listening within {START_TIMEOUT_S:.0f} s.")
        return self

    def _wait_ready(self) -> None:
        """Wait for ``on_start`` as long as it takes (an engine bounds its own start: vLLM's startup
        timeout), then at most START_TIMEOUT_S for uvicorn to listen."""
        assert self._serving is not None
        listening_deadline: float | None = None
        while not self._ready.wait(0.05) and not self._serving.done():
            if self._hooks_done.is_set():
                listening_deadline = listening_deadline or time.monotonic() + START_TIMEOUT_S
                if time.monotonic() > listening_deadline:
                    return

    def _ended(self, serving: Future[None], sock: socket.socket) -> None:
        """uvicorn stopped: close the socket; a failure is reported to start(), which re-raises it."""
        sock.close()
        if not serving.cancelled() and serving.exception() is not None:
            self._failure = serving.exception()
            self._ready.set()

    async def _main(self, sock: socket.socket) -> None:
        assert self._uvicorn is not None
        if self._on_start is not None:
            await self._on_start()
        self._hooks_done.set()
        try:
            serving = asyncio.ensure_future(self._uvicorn.serve(sockets=[sock]))
            while not self._uvicorn.started and not serving.done():
                await asyncio.sleep(0.01)
            if not self._uvicorn.started:
                await serving  # re-raises uvicorn's own error, if it has one
                raise RuntimeError("uvicorn stopped before it was listening")
            self._ready.set()
            await serving
        finally:
            if self._on_stop is not None:
                await self._on_stop()

    def run(self, coro: Coroutine[Any, Any, ResultT], timeout: float | None = None) -> ResultT:
        """Run a coroutine on the server's event loop and return its result."""
        if self._thread is None or not self._ready.is_set():
            coro.close()
            raise RuntimeError("The server is not running: call start() first.")
        return self._thread.run(coro, timeout)

    def stop(self) -> None:
        """Stop serving, run ``on_stop`` and stop the thread."""
        if self._uvicorn is None or self._thread is None or self._serving is None:
            return
        self._uvicorn.should_exit = True
        # A failure to serve was already reported by start(); here only its end matters.
        ended, _ = wait([self._serving], STOP_TIMEOUT_S)
        if not ended or not self._thread.stop(STOP_TIMEOUT_S):
            print(
                f"The {self.name} did not stop within {STOP_TIMEOUT_S:.0f} s; it ends with this process.",
                file=sys.stderr,
            )

    def __enter__(self) -> ServingThread:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()


SHUTDOWN_BODY = (
    b'{"error": {"message": "The server is shutting down; this call was not finished.", "code": 503}}'
)


class QuietShutdown:
    """Requests still running when uvicorn's graceful shutdown runs out are cancelled by uvicorn, which
    logs each one's ``CancelledError`` traceback ("timeout graceful shutdown exceeded"). A run that
    ends with rollouts in flight is expected to; such a request answers 503 (when nothing was sent
    yet) and ends quietly. Any other cancellation propagates."""

    def __init__(self, app: ASGIApp, stopping: Callable[[], bool]) -> None:
        self.app = app
        self.stopping = stopping

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = False

        async def tracked(message: Message) -> None:
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, receive, tracked)
        except asyncio.CancelledError:
            if not self.stopping():
                raise
            if not started:
                headers = [(b"content-type", b"application/json")]
                await send({"type": "http.response.start", "status": 503, "headers": headers})
                await send({"type": "http.response.body", "body": SHUTDOWN_BODY})


@contextmanager
def serve_in_thread(app: ASGIApp, host: str = "127.0.0.1", port: int = 0) -> Iterator[str]:
    """Serve ``app`` on ``host`` (a free port by default) until the block ends; yields its base URL."""
    with ServingThread(app, host, port) as thread:
        yield thread.url
