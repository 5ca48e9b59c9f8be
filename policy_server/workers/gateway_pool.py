"""Several gateway worker processes on one port, the job state kept in this process.

One gateway process tops out at one core of Python (HTTP parsing, JSON, pydantic, the call to vLLM);
behind it, vLLM's replicas do not. :class:`GatewayPool` binds the agents' port here and hands the
listening socket to ``workers`` processes (:mod:`policy_server.workers.gateway_worker`); the kernel gives
each accepted connection to one of them. The :class:`~policy_server.server.PolicyServer` the trainer
holds stays in this process with its registry and adapter versions, so the trainer's in-process API
(``open_job``, ``open_rollout``, ``take_trace``, ``counters``, ``load_adapter``) is unchanged; the
workers reach that state over Unix-socket links (:mod:`policy_server.workers.state_link`) answered on this
process's event loop.

Why the state stays in one place: a rollout's calls may arrive on any connection, hence any
worker, yet they share one call cap, one numbering (which seeds their sampling) and one trace. Only
admitting and recording a call cross the link (small messages); the per-call work stays in workers.

A worker that exits is reported (logged as an error, listed in :attr:`GatewayPool.failures`), the
adapter versions its calls held are released, and it is started again (at most
``MAX_RESTARTS`` times per pool); the other workers keep serving meanwhile.
"""

from __future__ import annotations

import asyncio
import logging
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
from collections import Counter
from collections.abc import Coroutine
from pathlib import Path
from typing import Any, TypeVar

from handlers import MAX_CONNECTIONS, START_TIMEOUT_S, STOP_TIMEOUT_S, LoopThread, tied_popen
from policy_server.engines.vllm import VLLMEngine
from policy_server.jobs import CallTicket
from policy_server.running import ServerThread, check_exposure
from policy_server.server import PolicyServer
from policy_server.trace import CallRecord
from policy_server.workers.gateway_worker import WORKER_ENV, WorkerSettings
from policy_server.workers.state_link import Handler, serve_link

logger = logging.getLogger(__name__)
ResultT = TypeVar("ResultT")

MAX_RESTARTS = 8
# How often the pool looks for workers that exited.
WATCH_INTERVAL_S = 0.5


def serve_gateway(
    server: PolicyServer, host: str, port: int, *, workers: int = 1, log_level: str = "warning"
) -> ServerThread | GatewayPool:
    """The gateway for ``server`` (not started): in this process (1 worker) or a pool of processes."""
    if workers <= 1:
        return ServerThread(server, host=host, port=port, log_level=log_level)
    return GatewayPool(server, host, port, workers=workers, log_level=log_level)


class _Worker:
    def __init__(self, index: int) -> None:
        self.index = index
        self.process: subprocess.Popen[bytes] | None = None
        self.ready = threading.Event()
        self.log = Path()
        self.calls = 0  # calls admitted through this worker, over its restarts


class _Link:
    """One worker connection: which worker (once it said so) and the adapter versions it holds."""

    def __init__(self) -> None:
        self.worker: _Worker | None = None
        self.held: Counter[int] = Counter()


class GatewayPool:
    """``workers`` gateway processes serving ``host:port``; the state and the engine stay here.

    Same surface as :class:`~policy_server.running.ServerThread`: ``start``, ``stop``, ``url``,
    ``run`` (a coroutine on the loop that owns the engine and answers the workers).
    """

    def __init__(
        self, server: PolicyServer, host: str = "127.0.0.1", port: int = 0, *, workers: int, log_level: str
    ) -> None:
        if not isinstance(server.engine, VLLMEngine):
            raise ValueError(
                "Several gateway workers need the vllm engine (each worker attaches to its server); "
                "the hf engine lives in this process, so serve it with one worker."
            )
        self.server = server
        self.host, self.port, self.log_level = host, port, log_level
        self.workers = [_Worker(index) for index in range(workers)]
        self.failures: list[str] = []
        self._restarts = 0
        self._stopping = False
        self._dir: Path | None = None
        self._sock: socket.socket | None = None
        self._thread: LoopThread | None = None
        self._link_server: asyncio.AbstractServer | None = None
        self._watcher: asyncio.Task[None] | None = None

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}"

    def calls_by_worker(self) -> list[int]:
        """Chat calls admitted through each worker so far (how the kernel spread the connections)."""
        return [worker.calls for worker in self.workers]

    def start(self) -> GatewayPool:
        """Start the engine and the link here, then the workers; return once all of them listen."""
        check_exposure(self.host, self.server)
        self._dir = Path(tempfile.mkdtemp(prefix="rftkit-gateway-"))  # mode 0700: the link is private
        self._sock = _listening_socket(self.host, self.port)
        self.port = self._sock.getsockname()[1]
        self._thread = LoopThread("gateway state").start()
        try:
            self.run(self._open())
            for worker in self.workers:
                self._spawn(worker)
            for worker in self.workers:
                self._wait_ready(worker)
            self._watcher = self.run(self._start_watching())
        except BaseException:
            self.stop()
            raise
        return self

    def run(self, coro: Coroutine[Any, Any, ResultT], timeout: float | None = None) -> ResultT:
        """Run a coroutine on the pool's event loop (the engine's) and return its result."""
        if self._thread is None:
            coro.close()
            raise RuntimeError("The gateway pool is not running: call start() first.")
        return self._thread.run(coro, timeout)

    def stop(self) -> None:
        """Stop the workers, then the link and the engine; safe to call twice."""
        self._stopping = True
        _terminate([worker.process for worker in self.workers if worker.process is not None])
        if self._thread is not None and self._thread.is_alive():
            try:
                self.run(self._close(), timeout=STOP_TIMEOUT_S)
            finally:
                self._thread.stop(STOP_TIMEOUT_S)
        if self._sock is not None:
            self._sock.close()
        if self._dir is not None:
            shutil.rmtree(self._dir, ignore_errors=True)

    def __enter__(self) -> GatewayPool:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    def _path(self, name: str) -> Path:
        """A file in the pool's private directory (the link's socket, the workers' logs)."""
        assert self._dir is not None, "the pool has not been started"
        return self._dir / name

    # On the pool's loop.

    async def _open(self) -> None:
        await self.server.start()
        self._link_server = await asyncio.start_unix_server(self._serve_worker, str(self._path("state.sock")))

    async def _close(self) -> None:
        if self._watcher is not None:
            self._watcher.cancel()
        if self._link_server is not None:
            self._link_server.close()
        await self.server.close()

    async def _start_watching(self) -> asyncio.Task[None]:
        return asyncio.ensure_future(self._watch())

    async def _serve_worker(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        link = _Link()
        try:
            await serve_link(reader, writer, self._handlers(link))
        finally:
            # A worker that died mid-call never releases what it held; without this, a version
            # its calls used would stay loaded in vLLM for the rest of the run.
            for version, count in list(link.held.items()):
                for _ in range(count):
                    self.server.metrics.calls_in_flight.dec()
                    await self.server.release_adapter_version(version)

    def _handlers(self, link: _Link) -> dict[str, Handler]:
        server, registry, held = self.server, self.server.registry, link.held

        def ready(index: int) -> None:
            link.worker = self.workers[index]
            link.worker.ready.set()

        def start_call(job_arn: str, rollout_id: str) -> CallTicket:
            ticket = registry.start_call(job_arn, rollout_id)
            if link.worker is not None:
                link.worker.calls += 1
            return ticket

        def acquire(job_arn: str, rollout_id: str) -> int:
            version = server.acquire_adapter_version(job_arn, rollout_id)
            held[version] += 1
            server.metrics.calls_in_flight.inc()
            return version

        async def release(version: int) -> None:
            held[version] -= 1
            if held[version] <= 0:
                del held[version]
            server.metrics.calls_in_flight.dec()
            await server.release_adapter_version(version)

        def record_call(ticket: CallTicket, record: CallRecord) -> None:
            registry.record_call(ticket, record)
            server.metrics.record_call(len(record.prompt_token_ids), len(record.completion_token_ids))

        return {
            "limits": registry.limits,
            "check_rollout": registry.check_rollout,
            "start_call": start_call,
            "record_call": record_call,
            "reject_call": registry.reject_call,
            "complete_rollout": server.complete_rollout,
            "update_reward": server.update_reward,
            "open_job": registry.open_job,
            "close_job": server.close_job,
            "open_rollout": server.open_rollout,
            "take_trace": server.take_trace,
            "counters": registry.counters,
            "open_rollout_count": registry.open_rollout_count,
            "open_rollouts": registry.open_rollouts,
            "acquire": acquire,
            "release": release,
            "current_version": lambda: server.current_adapter_version,
            "loaded_versions": lambda: server.loaded_adapter_versions,
            "load_adapter": server.load_adapter,
            "ready": ready,
        }

    async def _watch(self) -> None:
        while not self._stopping:
            await asyncio.sleep(WATCH_INTERVAL_S)
            for worker in self.workers:
                process = worker.process
                if self._stopping or process is None or process.poll() is None:
                    continue
                worker.ready.clear()
                self._report_exit(worker, process.returncode)
                if self._restarts < MAX_RESTARTS:
                    self._restarts += 1
                    self._spawn(worker)
                else:
                    worker.process = None

    # Workers.

    def _report_exit(self, worker: _Worker, code: int) -> None:
        alive = sum(1 for w in self.workers if w.process is not None and w.process.poll() is None)
        restart = "restarting it" if self._restarts < MAX_RESTARTS else "not restarting it"
        message = (
            f"gateway worker {worker.index} exited with code {code} ({alive} of {len(self.workers)} "
            f"still serve; {restart}); its calls in flight failed; last lines of {worker.log}:\n"
            f"{_tail(worker.log)}"
        )
        self.failures.append(message)
        logger.error(message)

    def _settings(self, worker: _Worker) -> WorkerSettings:
        server = self.server
        assert isinstance(server.engine, VLLMEngine) and self._sock is not None
        tokens = server.sagemaker_tokens
        return WorkerSettings(
            index=worker.index,
            listen_fd=self._sock.fileno(),
            link_path=str(self._path("state.sock")),
            model_dir=server.engine.model_dir,
            engine=server.engine.attach_settings(),
            policy_name=server.policy_name,
            api_key=server.api_key,
            admin_key=server.admin_key,
            adapters_dir=str(server.adapters_dir) if server.adapters_dir is not None else None,
            max_body_bytes=server.max_body_bytes,
            sagemaker_access_key_ids=sorted(tokens.access_key_ids) if tokens is not None else None,
            log_level=self.log_level,
        )

    def _spawn(self, worker: _Worker) -> None:
        assert self._sock is not None
        worker.ready.clear()
        worker.log = self._path(f"worker-{worker.index}.log")
        env = dict(os.environ, **{WORKER_ENV: self._settings(worker).model_dump_json()})
        with open(worker.log, "ab") as log:
            # Tied to this process, so a trainer that is SIGKILLed leaves no worker holding the port.
            worker.process = tied_popen(
                [sys.executable, "-m", "policy_server.workers.gateway_worker"],
                stdout=log,
                stderr=subprocess.STDOUT,
                env=env,
                pass_fds=[self._sock.fileno()],
            )

    def _wait_ready(self, worker: _Worker) -> None:
        assert worker.process is not None
        waited = 0.0
        while not worker.ready.wait(0.05):
            waited += 0.05
            if worker.process.poll() is not None or waited > START_TIMEOUT_S:
                raise RuntimeError(
                    f"Gateway worker {worker.index} did not start (exit code {worker.process.poll()}); "
                    f"last lines of {worker.log}:\n{_tail(worker.log)}"
                )


def _listening_socket(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    # Accepted connections inherit it: without it Nagle's algorithm meets the client's delayed ACK and
    # stalls every call (see handlers.serving).
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    try:
        sock.bind((host, port))
        sock.listen(MAX_CONNECTIONS)
    except OSError:
        sock.close()
        raise
    sock.set_inheritable(True)
    return sock


def _terminate(processes: list[subprocess.Popen[bytes]]) -> None:
    """SIGTERM all (uvicorn ends its calls gracefully), then wait; SIGKILL what outlives the wait."""
    running = [process for process in processes if process.poll() is None]
    for process in running:
        process.send_signal(signal.SIGTERM)
    for process in running:
        try:
            process.wait(STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def _tail(path: Path, lines: int = 20) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"
