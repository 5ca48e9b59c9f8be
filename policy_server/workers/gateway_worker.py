"""One gateway worker process: the gateway's routes on a shared listening socket, job state elsewhere.

Started by :class:`~policy_server.workers.gateway_pool.GatewayPool` (never by hand) with its settings in
the ``RFTKIT_GATEWAY_WORKER`` variable (it holds the keys, so not on the command line). The worker
attaches to the vLLM server the state process started and serves the unchanged gateway
(:func:`~policy_server.http.app.build_app`) over a :class:`WorkerPolicyServer`, whose registry and
adapter versions live in the state process (:mod:`policy_server.workers.remote_state`).
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
from pathlib import Path
from typing import Any

import uvicorn
from pydantic import BaseModel

from handlers import (
    HEADER_TIMEOUT_S,
    KEEP_ALIVE_S,
    MAX_CONNECTIONS,
    QuietShutdown,
    SageMakerTokenPolicy,
    protocol_with_header_timeout,
)
from policy_server.engines.vllm import VLLMEngine
from policy_server.server import PolicyServer
from policy_server.workers.remote_state import RemoteRegistry, RemoteVersions
from policy_server.workers.state_link import StateClient

WORKER_ENV = "RFTKIT_GATEWAY_WORKER"
# How often a worker checks that the process that started it is still alive.
PARENT_CHECK_S = 1.0


class WorkerSettings(BaseModel):
    """What a worker needs from the process that starts it."""

    index: int
    listen_fd: int
    link_path: str
    model_dir: str
    engine: dict[str, Any]
    policy_name: str
    api_key: str | None
    admin_key: str | None
    adapters_dir: str | None
    max_body_bytes: int
    sagemaker_access_key_ids: list[str] | None
    log_level: str


class WorkerPolicyServer(PolicyServer):
    """A :class:`PolicyServer` whose jobs, traces and adapter versions are the state process's."""

    def __init__(self, engine: VLLMEngine, link: StateClient, admin_link: StateClient, **kwargs: Any) -> None:
        super().__init__(engine, **kwargs)
        self.registry = RemoteRegistry(link)  # type: ignore[assignment]
        self._versions = RemoteVersions(link)  # type: ignore[assignment]
        self.link = link
        # Loading an adapter takes seconds: it goes over its own connection, from a thread, so the
        # worker's calls keep flowing meanwhile.
        self._admin_link = admin_link

    @property
    def current_adapter_version(self) -> int:
        return int(self.link.call("current_version"))

    @property
    def loaded_adapter_versions(self) -> tuple[int, ...]:
        return tuple(self.link.call("loaded_versions"))

    async def load_adapter(self, path: str | Path, version: int | None = None) -> int:
        """Load an adapter through the state process, which numbers versions for every worker."""
        return int(await asyncio.to_thread(self._admin_link.call, "load_adapter", str(path), version))


def worker_server(settings: WorkerSettings) -> WorkerPolicyServer:
    """The worker's policy server, linked to the state process twice (calls; slow admin work)."""
    tokens = None
    if settings.sagemaker_access_key_ids is not None:
        tokens = SageMakerTokenPolicy(access_key_ids=frozenset(settings.sagemaker_access_key_ids))
    return WorkerPolicyServer(
        VLLMEngine(settings.model_dir, **settings.engine),
        StateClient(settings.link_path),
        StateClient(settings.link_path),
        policy_name=settings.policy_name,
        api_key=settings.api_key,
        admin_key=settings.admin_key,
        adapters_dir=settings.adapters_dir,
        max_body_bytes=settings.max_body_bytes,
        sagemaker_tokens=tokens,
    )


async def serve(settings: WorkerSettings) -> None:
    """Attach to vLLM, serve the shared socket, tell the state process once listening."""
    server = worker_server(settings)
    await server.start()
    config = uvicorn.Config(
        QuietShutdown(server.app, lambda: http.should_exit),
        log_level=settings.log_level,
        lifespan="off",
        timeout_graceful_shutdown=5,
        timeout_keep_alive=KEEP_ALIVE_S,
        http=protocol_with_header_timeout(HEADER_TIMEOUT_S),
        limit_concurrency=MAX_CONNECTIONS,
    )
    http = uvicorn.Server(config)
    parent = os.getppid()
    try:
        serving = asyncio.ensure_future(http.serve(sockets=[socket.socket(fileno=settings.listen_fd)]))
        while not http.started and not serving.done():
            await asyncio.sleep(0.01)
        if serving.done():
            await serving
            raise RuntimeError("uvicorn stopped before it was listening")
        server.link.send("ready", settings.index)
        # An orphaned worker (its trainer killed outright) must not keep serving a dead job state.
        while not serving.done():
            await asyncio.wait({serving}, timeout=PARENT_CHECK_S)
            if os.getppid() != parent:
                http.should_exit = True
        await serving
    finally:
        await server.close()


def main() -> None:
    settings = WorkerSettings.model_validate_json(os.environ[WORKER_ENV])
    logging.basicConfig(level=settings.log_level.upper())
    asyncio.run(serve(settings))


if __name__ == "__main__":
    main()
