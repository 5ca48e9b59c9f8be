"""Prometheus metrics of the policy server, served on their own port (never on the agents' port).

Each :class:`ServerMetrics` owns a fresh ``CollectorRegistry``, not prometheus_client's global one,
so several servers in one process (the tests, a trainer with an evaluation server) never clash. The
trainer publishes its step metrics into the same registry (``trainer.prometheus``), so one scrape
of ``/metrics`` shows the whole run.

Series (all prefixed ``rftkit_``): HTTP calls and their latency by route and status, prompt and
sampled tokens, calls and rollouts in flight, the current adapter version, rollouts the agents
reported by status, and the engine's batch occupancy.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
)
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from handlers import RolloutStatus, ServingThread
from policy_server.engines.base import EngineOccupancy

if TYPE_CHECKING:
    from policy_server.server import PolicyServer

METRICS_PATH = "/metrics"
# Latency buckets from a loopback 4xx (~1 ms) to a long CPU generation (minutes).
LATENCY_BUCKETS = (0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300)
# Paths outside the app's routes share one label, so probes of random paths cannot grow the series.
OTHER_ROUTE = "other"


class ServerMetrics:
    """The policy server's series, in a registry of their own."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        self.requests = Counter(
            "rftkit_http_requests",
            "HTTP calls answered, by route and status.",
            ["route", "status"],
            registry=self.registry,
        )
        self.latency = Histogram(
            "rftkit_http_request_duration_seconds",
            "Time from a call's arrival to the end of its answer, by route and status.",
            ["route", "status"],
            buckets=LATENCY_BUCKETS,
            registry=self.registry,
        )
        self.prompt_tokens = Counter(
            "rftkit_prompt_tokens", "Prompt (prefill) tokens of sampled chat calls.", registry=self.registry
        )
        self.sampled_tokens = Counter(
            "rftkit_sampled_tokens", "Tokens sampled by the engine for chat calls.", registry=self.registry
        )
        self.calls_in_flight = Gauge(
            "rftkit_calls_in_flight", "Chat calls the engine is working on now.", registry=self.registry
        )
        self.rollouts_reported = Counter(
            "rftkit_rollouts_reported",
            "Rollouts the agents reported through /complete-rollout, by status.",
            ["status"],
            registry=self.registry,
        )
        for status in RolloutStatus:  # both series exist from the start, at zero
            self.rollouts_reported.labels(status.value)

    def watch(self, server: PolicyServer) -> None:
        """Series read from ``server`` at scrape time: rollouts in flight, adapter version, engine load."""
        rollouts = Gauge(
            "rftkit_rollouts_in_flight",
            "Rollouts opened and not yet taken by the trainer, over all open jobs.",
            registry=self.registry,
        )
        rollouts.set_function(lambda: float(server.registry.open_rollouts()))
        version = Gauge(
            "rftkit_adapter_version",
            "Adapter version new calls sample with (0: the base model).",
            registry=self.registry,
        )
        version.set_function(lambda: float(server.current_adapter_version))
        self.registry.register(EngineCollector(lambda: engine_occupancy(server.engine)))

    def record_call(self, prompt_tokens: int, sampled_tokens: int) -> None:
        self.prompt_tokens.inc(prompt_tokens)
        self.sampled_tokens.inc(sampled_tokens)

    def exposition(self) -> bytes:
        """The registry in Prometheus' text format."""
        return generate_latest(self.registry)


def engine_occupancy(engine: object) -> EngineOccupancy | None:
    """The engine's batch occupancy, for engines that can tell (``occupancy()``); else None."""
    read = getattr(engine, "occupancy", None)
    return read() if callable(read) else None


class EngineCollector(Collector):
    """The engine's batch occupancy, read when scraped (a failed read leaves the series out)."""

    def __init__(self, read: Callable[[], EngineOccupancy | None]) -> None:
        self._read = read

    def collect(self) -> Iterable[Metric]:
        try:
            load = self._read()
        except Exception:  # an engine that cannot answer now must not break the scrape
            load = None
        if load is None:
            return []
        families: list[Metric] = [
            GaugeMetricFamily("rftkit_engine_running", "Calls in the engine's current batch.", load.running),
            GaugeMetricFamily("rftkit_engine_waiting", "Calls queued for the next batch.", load.waiting),
        ]
        if load.capacity is not None:
            families.append(
                GaugeMetricFamily(
                    "rftkit_engine_batch_capacity", "Most calls one batch holds.", load.capacity
                )
            )
        if load.forward_passes is not None and load.batch_rows is not None:
            families.append(
                CounterMetricFamily(
                    "rftkit_engine_forward_passes", "Model forward passes.", load.forward_passes
                )
            )
            families.append(
                CounterMetricFamily(
                    "rftkit_engine_batch_rows",
                    "Rows over all forward passes (rate / rate of forward passes: mean batch occupancy).",
                    load.batch_rows,
                )
            )
        return families


class RequestMetricsMiddleware:
    """Counts every HTTP call and times it by route and status (streamed answers until their end)."""

    def __init__(self, app: ASGIApp, metrics: ServerMetrics, routes: Iterable[str]) -> None:
        self.app = app
        self.metrics = metrics
        self.routes = frozenset(routes)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = time.perf_counter()
        status = 500  # what the client sees if the app fails before it answers

        async def send_and_note(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = int(message["status"])
            await send(message)

        try:
            await self.app(scope, receive, send_and_note)
        finally:
            route = scope["path"] if scope["path"] in self.routes else OTHER_ROUTE
            labels = (route, str(status))
            self.metrics.requests.labels(*labels).inc()
            self.metrics.latency.labels(*labels).observe(time.perf_counter() - started)


def metrics_app(metrics: ServerMetrics) -> Starlette:
    """The app of the metrics port: ``GET /metrics`` in Prometheus' text format."""

    def scrape(request: Request) -> Response:
        # A sync endpoint runs in a worker thread: reading a vLLM engine's load may take a moment.
        return Response(metrics.exposition(), media_type=CONTENT_TYPE_LATEST)

    return Starlette(routes=[Route(METRICS_PATH, scrape, methods=["GET"])])


def start_metrics_server(metrics: ServerMetrics, host: str, port: int) -> ServingThread:
    """Serve ``metrics`` on ``host:port`` (0: a free port) from a background thread; stop() ends it."""
    return ServingThread(metrics_app(metrics), host, port, name="metrics server").start()
