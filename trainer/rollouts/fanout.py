"""Rollout fan-out: wire-protocol payloads to agent targets, each rollout classified ok or failed by cause.

Targets are http(s) base URLs (``POST {url}/invocations``) and AgentCore runtime ARNs
(``invoke_agent_runtime``); each attempt goes to the target with the fewest outstanding requests.
Every rollout has a deadline that covers all its attempts: nothing waits past it. Transport failures
(refused, reset, closed, 429, 502, 503, 504) are retried with exponential backoff and jitter while the
deadline allows; other answers are final. A failed rollout carries its cause and never a reward: the
loop drops it from its group's statistics instead of scoring it zero. Calling one agent and reading its
answer is :mod:`handlers.agent_client`'s, shared with ``rft smoke``.
"""

from __future__ import annotations

import asyncio
import json
import random
import ssl
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from typing import Any

import httpx
from botocore.exceptions import (
    BotoCoreError,
    ClientError,
    ConnectionClosedError,
    EndpointConnectionError,
    ReadTimeoutError,
)

from handlers import (
    AgentAnswer,
    FailureCause,
    InferenceParams,
    RftkitExtras,
    RolloutMetadata,
    RolloutPayload,
    agentcore_client,
    arn_region,
    client_error_answer,
    invocations_url,
    invoke_runtime,
    is_runtime_arn,
    read_answer,
    retry_delay,
    runtime_session_id,
    unreachable,
)
from trainer.config import RewardAggregation, TrainConfig
from trainer.errors import TrainingError
from trainer.rollouts.outcomes import RolloutOutcome, aggregate_rewards

# How long `rft train` waits for agents started beside it to listen, probing every interval.
AGENT_START_GRACE_S = 20.0
AGENT_PROBE_INTERVAL_S = 0.25


@dataclass(frozen=True)
class RolloutRequest:
    """One episode to play: a dataset row for one member of one group."""

    row: Any
    rollout_id: str
    group_index: int
    job_arn: str
    endpoint: str
    inference_params: InferenceParams | None = None
    extras: RftkitExtras | None = None
    row_name: str | None = None  # which dataset row this is, named in a failure's text
    row_index: int | None = None  # its position in its dataset file, from 0 (transcripts name it)

    def payload(self) -> RolloutPayload:
        """The wire payload (the row goes to ``prompt`` as it is)."""
        return RolloutPayload(
            prompt=self.row,
            metadata=RolloutMetadata(
                job_arn=self.job_arn, rollout_id=self.rollout_id, endpoint=self.endpoint
            ),
            inference_params=self.inference_params,
            rftkit=self.extras,
        )


class _Retryable(Exception):
    """A transport failure worth another attempt."""


# ---------------------------------------------------------------------------------------------------
# Targets


@dataclass
class _Target:
    address: str
    outstanding: int = 0
    dispatched: int = 0


AgentCoreClientFactory = Callable[[str], Any]


class Fanout:
    """Sends rollouts to agent targets and classifies every outcome.

    Its HTTP client and semaphore belong to the event loop that first uses them: make one per loop,
    ``async with Fanout.from_config(config) as fanout: outcomes = await fanout.run(requests)``.
    """

    def __init__(
        self,
        targets: Sequence[str],
        *,
        max_concurrent: int = 64,
        rollout_timeout_s: float = 300.0,
        max_retries: int = 3,
        retry_backoff_s: float = 0.5,
        reward_aggregation: RewardAggregation = "sum",
        agent_qualifier: str | None = None,
        aws_region: str | None = None,
        agentcore_client: AgentCoreClientFactory | None = None,
    ) -> None:
        if not targets:
            raise ValueError("give at least one agent target (an http(s) URL or an AgentCore runtime ARN)")
        self._targets = [_Target(target.rstrip("/")) for target in targets]
        # The target each rollout's attempt in flight was sent to (the stall watchdog groups by it).
        self.playing_at: dict[str, str] = {}
        # Each rollout's task while it plays, and the text of those the stall watchdog fails (fail_stalled).
        self._tasks: dict[str, asyncio.Task[Any]] = {}
        self._stalled: dict[str, tuple[str, str | None]] = {}
        self._semaphore = asyncio.Semaphore(max_concurrent)
        self.rollout_timeout_s = rollout_timeout_s
        self.max_retries = max_retries
        self.retry_backoff_s = retry_backoff_s
        self.reward_aggregation: RewardAggregation = reward_aggregation
        self.agent_qualifier = agent_qualifier
        self.aws_region = aws_region
        self._client_factory = agentcore_client or self._default_agentcore_client
        self._agentcore_clients: dict[str, Any] = {}
        # One HTTP client per concurrent rollout, not one pool for all: httpcore's pool scans every
        # connection and queued request on each request, which costs CPU per rollout that grows with
        # the pool (bench/fanout_capacity.py). A client takes one rollout at a time and keeps its
        # connections to the targets alive; they share one TLS context (costly to make).
        self._http_targets = sum(not is_runtime_arn(target.address) for target in self._targets)
        self._tls = ssl.create_default_context() if self._http_targets else None
        self._idle_http: list[httpx.AsyncClient] = []
        self._all_http: list[httpx.AsyncClient] = []
        has_arns = any(is_runtime_arn(target.address) for target in self._targets)
        # boto3 blocks; its calls get their own threads so they never queue behind the default pool.
        self._executor = ThreadPoolExecutor(max_concurrent, "rftkit-agentcore") if has_arns else None
        self._jitter = random.Random()

    @classmethod
    def from_config(cls, config: TrainConfig, **kwargs: Any) -> Fanout:
        """A fan-out with the config's targets, concurrency, deadline, retries and aggregation."""
        return cls(
            config.agents,
            max_concurrent=config.max_concurrent_rollouts,
            rollout_timeout_s=config.rollout_timeout_s,
            max_retries=config.max_retries,
            retry_backoff_s=config.retry_backoff_s,
            reward_aggregation=config.reward_aggregation,
            agent_qualifier=config.agent_qualifier,
            aws_region=config.aws_region,
            **kwargs,
        )

    async def __aenter__(self) -> Fanout:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        for client in self._all_http:
            await client.aclose()
        if self._executor is not None:
            # A boto3 call past its deadline may still be reading; it ends on its own read timeout.
            self._executor.shutdown(wait=False, cancel_futures=True)

    def outstanding(self) -> dict[str, int]:
        """Requests in flight per target."""
        return {target.address: target.outstanding for target in self._targets}

    async def run(self, requests: Sequence[RolloutRequest]) -> list[RolloutOutcome]:
        """Play every request; outcomes in the same order. Never raises for a failed rollout."""
        return list(await asyncio.gather(*(self.run_one(request) for request in requests)))

    async def run_one(self, request: RolloutRequest) -> RolloutOutcome:
        """Play one rollout within its deadline (counted from when a concurrency slot frees up), unless
        the stall watchdog fails it first (:meth:`fail_stalled`)."""
        task = asyncio.current_task()
        assert task is not None
        self._tasks[request.rollout_id] = task
        started = time.monotonic()
        try:
            return await self._play(request)
        except asyncio.CancelledError:
            stalled = self._stalled.pop(request.rollout_id, None)
            # The watchdog's cancellation ends here (the rollout's outcome is its failure); any other
            # (the loop closing) goes on.
            if stalled is None or task.uncancel() > 0:
                raise
            return self._failed(request, FailureCause.STALLED, stalled[0], 0, started, stalled[1])
        finally:
            self._tasks.pop(request.rollout_id, None)

    async def fail_stalled(self, rollout_ids: Sequence[str], error: str) -> int:
        """Fail these rollouts, where still playing, by cause ``stalled`` with ``error`` (their agent
        calls are cancelled); how many were. Runs on the fan-out's loop."""
        failed = 0
        for rollout_id in rollout_ids:
            task = self._tasks.get(rollout_id)
            if task is not None and rollout_id not in self._stalled:
                self._stalled[rollout_id] = (error, self.playing_at.get(rollout_id))
                task.cancel()
                failed += 1
        return failed

    async def _play(self, request: RolloutRequest) -> RolloutOutcome:
        async with self._semaphore:
            started = time.monotonic()
            attempts = 0
            last_target: str | None = None
            body = json.dumps(request.payload().to_wire()).encode()
            loop = asyncio.get_running_loop()
            deadline = loop.time() + self.rollout_timeout_s
            try:
                async with asyncio.timeout_at(deadline):
                    while True:
                        attempts += 1
                        target = self._pick_target()
                        last_target = target.address
                        try:
                            answer = await self._attempt(target, request, body)
                            break
                        except _Retryable as error:
                            delay = self._backoff(attempts)
                            if attempts > self.max_retries or loop.time() + delay >= deadline:
                                return self._failed(
                                    request,
                                    FailureCause.TRANSPORT,
                                    f"{error} (after {attempts} attempts)",
                                    attempts,
                                    started,
                                    last_target,
                                )
                            await asyncio.sleep(delay)
            except TimeoutError:
                return self._failed(
                    request,
                    FailureCause.TIMEOUT,
                    f"no answer within {self.rollout_timeout_s:g} s",
                    attempts,
                    started,
                    last_target,
                )
        if answer.cause is not None:
            outcome = self._failed(request, answer.cause, answer.error or "", attempts, started, last_target)
            return replace(outcome, metrics=answer.metrics)
        assert answer.rewards is not None
        return RolloutOutcome(
            rollout_id=request.rollout_id,
            group_index=request.group_index,
            row_name=request.row_name,
            status="ok",
            rewards=answer.rewards,
            reward=aggregate_rewards(answer.rewards, self.reward_aggregation),
            metrics=answer.metrics,
            attempts=attempts,
            latency_s=time.monotonic() - started,
            target=last_target,
        )

    def _failed(
        self,
        request: RolloutRequest,
        cause: FailureCause,
        error: str,
        attempts: int,
        started: float,
        target: str | None,
    ) -> RolloutOutcome:
        return RolloutOutcome(
            rollout_id=request.rollout_id,
            group_index=request.group_index,
            row_name=request.row_name,
            status="failed",
            cause=cause,
            error=error,
            attempts=attempts,
            latency_s=time.monotonic() - started,
            target=target,
        )

    def _pick_target(self) -> _Target:
        # Fewest outstanding first; among equals the least used, so equal targets take turns.
        return min(self._targets, key=lambda target: (target.outstanding, target.dispatched))

    def _backoff(self, attempt: int) -> float:
        return retry_delay(self.retry_backoff_s, attempt, self._jitter)

    async def _attempt(self, target: _Target, request: RolloutRequest, body: bytes) -> AgentAnswer:
        target.outstanding += 1
        target.dispatched += 1
        self.playing_at[request.rollout_id] = target.address
        try:
            if is_runtime_arn(target.address):
                return await self._invoke_runtime(target.address, request, body)
            return await self._post(target.address, body)
        finally:
            target.outstanding -= 1
            self.playing_at.pop(request.rollout_id, None)

    # --- http(s) targets

    def _http_client(self) -> httpx.AsyncClient:
        """An idle client (the most recently used, its connections warm), or a new one."""
        if self._idle_http:
            return self._idle_http.pop()
        assert self._tls is not None
        client = httpx.AsyncClient(
            timeout=None,  # the rollout deadline bounds every request
            limits=httpx.Limits(max_connections=self._http_targets),
            verify=self._tls,
        )
        self._all_http.append(client)
        return client

    async def _post(self, url: str, body: bytes) -> AgentAnswer:
        endpoint = invocations_url(url)
        client = self._http_client()
        try:
            response = await client.post(endpoint, content=body, headers={"Content-Type": "application/json"})
        except httpx.TransportError as error:
            raise _Retryable(f"{type(error).__name__} from {endpoint}: {error}") from None
        finally:
            self._idle_http.append(client)
        answer = read_answer(response.status_code, response.content)
        if answer.retryable:
            raise _Retryable(f"{answer.error} from {endpoint}")
        return answer

    # --- AgentCore runtime targets

    def _default_agentcore_client(self, region: str) -> Any:
        return agentcore_client(region, read_timeout_s=self.rollout_timeout_s)

    def _agentcore_client(self, arn: str) -> Any:
        region = self.aws_region or arn_region(arn)
        if region not in self._agentcore_clients:
            self._agentcore_clients[region] = self._client_factory(region)
        return self._agentcore_clients[region]

    async def _invoke_runtime(self, arn: str, request: RolloutRequest, body: bytes) -> AgentAnswer:
        client = self._agentcore_client(arn)
        session_id = runtime_session_id(request.rollout_id)

        def invoke() -> tuple[int, bytes]:
            return invoke_runtime(client, arn, body, session_id=session_id, qualifier=self.agent_qualifier)

        assert self._executor is not None
        try:
            status, content = await asyncio.get_running_loop().run_in_executor(self._executor, invoke)
        except ClientError as error:
            answer = client_error_answer(error.response)
            if answer.retryable:
                raise _Retryable(f"{answer.error} from {arn}") from None
            return answer
        except (EndpointConnectionError, ConnectionClosedError, ReadTimeoutError) as error:
            raise _Retryable(f"{type(error).__name__} from {arn}: {error}") from None
        except BotoCoreError as error:
            message = f"{type(error).__name__} calling {arn}: {error}"
            return AgentAnswer(FailureCause.AGENT_ERROR, error=message)
        answer = read_answer(status, content)
        if answer.retryable:
            raise _Retryable(f"{answer.error} from {arn}")
        return answer


def check_agents_listen(targets: Sequence[str], *, grace_s: float | None = None) -> None:
    """Refuse a run whose agent URLs nothing listens at, before a model loads: every rollout would
    fail after the load, and the agents' logs (which a user would be sent to) hold nothing.

    An agent started beside the run (a container, ``python main.py &``) may not listen yet: the URLs
    are probed again for ``grace_s`` (``AGENT_START_GRACE_S``) before :class:`TrainingError` names
    each one still out of reach (:func:`handlers.agent_client.unreachable`); AgentCore ARNs are not
    probed.
    """
    grace = AGENT_START_GRACE_S if grace_s is None else grace_s
    deadline = time.monotonic() + grace
    while problems := [problem for target in targets if (problem := unreachable(target)) is not None]:
        if time.monotonic() >= deadline:
            raise TrainingError(
                f"{'; '.join(problems)}, for {grace:g} s: start the agent there (its main.py serves port "
                "8080) or correct the config's agents; checked before the model loads"
            )
        time.sleep(AGENT_PROBE_INTERVAL_S)
