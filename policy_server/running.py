"""``ServerThread``: uvicorn and the policy server's event loop in a background thread.

The trainer keeps its own thread for learning and reaches the server's loop through :meth:`run`
(for coroutines such as ``load_adapter``); the engine starts and closes on that loop. The thread
itself is :class:`handlers.serving.ServingThread`, the one way rftkit runs uvicorn in a thread.
"""

from __future__ import annotations

from starlette.types import ASGIApp

from handlers import HEADER_TIMEOUT_S, ServingThread, exposure_refusal
from policy_server.server import PolicyServer


def check_exposure(host: str, server: PolicyServer) -> None:
    """Raise the refusal of :func:`exposure_refusal` unless ``server`` was told to serve unguarded."""
    refusal = exposure_refusal(host, server.api_key, server.sagemaker_tokens is not None)
    if refusal is not None and not server.allow_unauthenticated_network:
        raise RuntimeError(refusal)


class ServerThread(ServingThread):
    """Serve a :class:`PolicyServer` (or any ASGI app) on ``host:port`` from a background thread.

    The server's engine starts and closes on the thread's event loop, the loop that serves calls.
    """

    def __init__(
        self,
        server_or_app: PolicyServer | ASGIApp,
        host: str = "127.0.0.1",
        port: int = 0,
        *,
        log_level: str = "warning",
        header_timeout_s: float = HEADER_TIMEOUT_S,
    ) -> None:
        self.server = server_or_app if isinstance(server_or_app, PolicyServer) else None
        app: ASGIApp = server_or_app.app if isinstance(server_or_app, PolicyServer) else server_or_app
        super().__init__(
            app,
            host,
            port,
            log_level=log_level,
            on_start=self.server.start if self.server is not None else None,
            on_stop=self.server.close if self.server is not None else None,
            name="policy server",
            header_timeout_s=header_timeout_s,
        )

    def start(self) -> ServerThread:
        """Start the engine and uvicorn; return once the socket is listening."""
        if self.server is not None:
            check_exposure(self.host, self.server)
        super().start()
        return self

    def __enter__(self) -> ServerThread:
        return self.start()
