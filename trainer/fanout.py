"""Rollout fan-out: wire-protocol payloads to agent targets, each rollout classified ok or failed by cause.

Targets are http(s) base URLs (``POST {url}/invocations``) and AgentCore runtime ARNs
(``invoke_agent_runtime``); each attempt goes to the target with the fewest outstanding requests.
Every rollout has a deadline that covers all its attempts: nothing waits past it. Transport failures
(refused, reset, closed, 429, 502, 503, 504) are retried with exponential backoff and jitter while the
deadline allows; other answers are final. A failed rollout carries its cause and never a reward: the
loop drops it from its group's statistics instead of scoring it zero.
"""

from __future__ import annotations

import asyncio
import json
import math
import random
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from enum import StrEnum
from typing import Any, Literal

import boto3
import httpx
from botocore.config import Config as BotoConfig
from botocore.exceptions import (
    BotoCoreError,
    ClientError,
    ConnectionClosedError,
    EndpointConnectionError,
    ReadTimeoutError,
)

from handlers.protocol import (
    InferenceParams,
    ResultStatus,
    RftkitExtras,
    RolloutMetadata,
    RolloutPayload,
)
from trainer.config import RewardAggregation, TrainConfig

# HTTP answers that mean "the agent is there but cannot take this now": retried like a dropped connection.
RETRYABLE_STATUS = frozenset({429, 502, 503, 504})
_RETRYABLE_AWS_CODES = frozenset({"ThrottlingException", "RetryableConflictException", "ServiceUnavailable"})
_SESSION_NAMESPACE = uuid.UUID("5b0c3c5e-7f0e-4a55-9d8a-2f1b6f3f0a11")


class FailureCause(StrEnum):
    """Why a rollout gives no reward."""

    AGENT_ERROR = "agent_error"  # the agent answered 4xx/5xx (not 429/502-504) or reported itself failed
    TIMEOUT = "timeout"  # the rollout's deadline passed
    TRANSPORT = "transport"  # refused, reset, closed, 429, 502-504, still failing after the retries
    BAD_REWARD = "bad_reward"  # a reward that is NaN, infinite or not a number
    BAD_RESPONSE = "bad_response"  # a 200 answer that is not a rollout result
    SKIPPED = "skipped"  # the agent skipped the row ({"status": "skipped"})
    NO_REPORT = "no_report"  # the agent finished but reported no reward, neither answer nor update-reward


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


def group_requests(
    row: Any,
    group_index: int,
    num_generations: int,
    *,
    job_arn: str,
    endpoint: str,
    inference_params: InferenceParams | None = None,
    extras: RftkitExtras | None = None,
) -> list[RolloutRequest]:
    """``num_generations`` requests for one row, each with a fresh rollout id."""
    return [
        RolloutRequest(
            row=row,
            rollout_id=f"g{group_index}-{member}-{uuid.uuid4().hex[:16]}",
            group_index=group_index,
            job_arn=job_arn,
            endpoint=endpoint,
            inference_params=inference_params,
            extras=extras,
        )
        for member in range(num_generations)
    ]


@dataclass(frozen=True)
class RolloutOutcome:
    """How one rollout ended. ``reward`` is set exactly when ``status`` is ``ok``."""

    rollout_id: str
    group_index: int
    status: Literal["ok", "failed"]
    cause: FailureCause | None = None
    rewards: list[float] | None = None
    reward: float | None = None
    metrics: dict[str, float] = field(default_factory=dict)
    error: str | None = None
    attempts: int = 0
    latency_s: float = 0.0
    target: str | None = None

    @property
    def ok(self) -> bool:
        return self.status == "ok"


def mean_agent_metrics(outcomes: Sequence[RolloutOutcome]) -> dict[str, float]:
    """Each metric the agents reported, averaged over the successful rollouts that reported it."""
    values: dict[str, list[float]] = {}
    for outcome in outcomes:
        if outcome.ok:
            for name, value in outcome.metrics.items():
                values.setdefault(name, []).append(value)
    return {name: math.fsum(series) / len(series) for name, series in sorted(values.items())}


ERROR_TEXT_CHARS = 500  # how much of an error's text the run's metrics and log keep per cause


@dataclass
class FailureCounts:
    """Failed rollouts counted by cause, with the first error text of each cause."""

    counts: Counter[FailureCause] = field(default_factory=Counter)
    first_errors: dict[FailureCause, str] = field(default_factory=dict)

    def add(self, outcomes: Iterable[RolloutOutcome]) -> None:
        for outcome in outcomes:
            if outcome.cause is not None:
                self.counts[outcome.cause] += 1
                text = (outcome.error or "(no error text)")[:ERROR_TEXT_CHARS]
                self.first_errors.setdefault(outcome.cause, text)

    @property
    def total(self) -> int:
        return sum(self.counts.values())

    def as_dict(self) -> dict[str, int]:
        """Every cause with its count, zeros included (stable metric columns)."""
        return {cause.value: self.counts[cause] for cause in FailureCause}

    def errors_dict(self) -> dict[str, str]:
        """The first error text of each cause seen."""
        return {cause.value: text for cause, text in self.first_errors.items()}

    def describe(self) -> str:
        """One line per cause seen: ``agent_error x15, first: HTTP 500: ...``."""
        return "; ".join(
            f"{cause.value} x{self.counts[cause]}, first: {self.first_errors[cause]}"
            for cause in FailureCause
            if self.counts[cause]
        )


def aggregate_rewards(rewards: Sequence[float], how: RewardAggregation) -> float:
    """The episode reward of a per-turn list: its sum, its last value or its mean."""
    if not rewards:
        raise ValueError("cannot aggregate an empty reward list")
    if how == "sum":
        return math.fsum(rewards)
    if how == "last":
        return float(rewards[-1])
    return math.fsum(rewards) / len(rewards)


def resolve_reward(
    outcome: RolloutOutcome, trace_rewards: list[float] | None, aggregation: RewardAggregation = "sum"
) -> RolloutOutcome:
    """Fill in the reward from ``update-reward`` (the trace) when the answer carried none.

    The ``/invocations`` answer wins when it has a reward; only a ``no_report`` outcome changes.
    """
    if outcome.cause != FailureCause.NO_REPORT or not trace_rewards:
        return outcome
    if not all(math.isfinite(reward) for reward in trace_rewards):
        return replace(outcome, cause=FailureCause.BAD_REWARD, error=f"update-reward sent {trace_rewards}")
    return replace(
        outcome,
        status="ok",
        cause=None,
        error=None,
        rewards=list(trace_rewards),
        reward=aggregate_rewards(trace_rewards, aggregation),
    )


@dataclass(frozen=True)
class GroupCheck:
    """Whether a group gives a gradient; false with a reason when it does not."""

    trainable: bool
    reason: str | None = None

    def __bool__(self) -> bool:
        return self.trainable


def group_is_trainable(outcomes: Sequence[RolloutOutcome]) -> GroupCheck:
    """A group trains only with two or more valid rollouts whose rewards differ."""
    rewards = [outcome.reward for outcome in outcomes if outcome.ok and outcome.reward is not None]
    if len(rewards) < 2:
        reason = f"only {len(rewards)} valid rollout(s) of {len(outcomes)}"
        failures = FailureCounts()
        failures.add(outcomes)
        return GroupCheck(False, f"{reason} ({failures.describe()})" if failures.total else reason)
    if max(rewards) - min(rewards) == 0.0:
        return GroupCheck(False, f"no reward variance (all {len(rewards)} rewards are {rewards[0]:g})")
    return GroupCheck(True)


# ---------------------------------------------------------------------------------------------------
# Reading the agent's answer


@dataclass(frozen=True)
class _Answer:
    cause: FailureCause | None
    rewards: list[float] | None = None
    metrics: dict[str, float] = field(default_factory=dict)
    error: str | None = None


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _read_answer(body: bytes) -> _Answer:
    """Classify a 200 answer: the shapes rft_handler and the service's own handlers return."""
    try:
        result = json.loads(body)
    except (json.JSONDecodeError, UnicodeDecodeError):
        return _Answer(FailureCause.BAD_RESPONSE, error=f"the answer is not JSON: {body[:200]!r}")
    if _is_number(result) or isinstance(result, list):
        return _rewards_answer(result, {})
    if not isinstance(result, dict):
        return _Answer(
            FailureCause.BAD_RESPONSE, error=f"the answer is not a rollout result: {result!r:.200}"
        )
    status = result.get("status", ResultStatus.READY.value)
    if status == ResultStatus.SKIPPED.value:
        return _Answer(FailureCause.SKIPPED, error="the agent skipped the row")
    if status in (ResultStatus.FAILED.value, "error"):
        return _Answer(
            FailureCause.AGENT_ERROR, error=str(result.get("error") or "the agent reported failure")
        )
    if status != ResultStatus.READY.value:
        return _Answer(FailureCause.BAD_RESPONSE, error=f"unknown rollout status {status!r}")
    metrics = result.get("metrics") or {}
    if not isinstance(metrics, dict):
        metrics = {}
    numeric_metrics = {str(k): float(v) for k, v in metrics.items() if _is_number(v) or isinstance(v, bool)}
    rewards = result.get("rewards")
    if rewards is None:
        rewards = result.get("reward")
    if rewards is None:
        return _Answer(FailureCause.NO_REPORT, metrics=numeric_metrics, error="the answer carries no reward")
    return _rewards_answer(rewards, numeric_metrics)


def _rewards_answer(value: Any, metrics: dict[str, float]) -> _Answer:
    values = value if isinstance(value, list) else [value]
    if not values:
        return _Answer(FailureCause.BAD_REWARD, error="the answer's reward list is empty")
    if not all(_is_number(item) and math.isfinite(item) for item in values):
        return _Answer(FailureCause.BAD_REWARD, error=f"the answer's reward is not finite: {value!r:.200}")
    return _Answer(None, rewards=[float(item) for item in values], metrics=metrics)


def _error_text(status: int, body: bytes) -> str:
    try:
        message = json.loads(body).get("error")
    except (json.JSONDecodeError, UnicodeDecodeError, AttributeError):
        message = None
    return f"HTTP {status}: {message or body[:200].decode('utf-8', 'replace')}"


class _Retryable(Exception):
    """A transport failure worth another attempt."""


class _Final(Exception):
    """A failure that another attempt would repeat."""

    def __init__(self, cause: FailureCause, message: str) -> None:
        super().__init__(message)
        self.cause = cause


# ---------------------------------------------------------------------------------------------------
# Targets


def is_agent_runtime_arn(target: str) -> bool:
    return target.startswith("arn:") and ":bedrock-agentcore:" in target


def runtime_session_id(rollout_id: str) -> str:
    """The AgentCore session id of a rollout: stable, 39 characters (the service wants 33 to 256)."""
    return f"rftkit-{uuid.uuid5(_SESSION_NAMESPACE, rollout_id).hex}"


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
        self._semaphore = asyncio.Semaphore(max_concurrent)
        self.rollout_timeout_s = rollout_timeout_s
        self.max_retries = max_retries
        self.retry_backoff_s = retry_backoff_s
        self.reward_aggregation: RewardAggregation = reward_aggregation
        self.agent_qualifier = agent_qualifier
        self.aws_region = aws_region
        self._client_factory = agentcore_client or self._default_agentcore_client
        self._agentcore_clients: dict[str, Any] = {}
        self._http = httpx.AsyncClient(
            timeout=None,  # the rollout deadline bounds every request
            limits=httpx.Limits(max_connections=max_concurrent, max_keepalive_connections=max_concurrent),
        )
        has_arns = any(is_agent_runtime_arn(target.address) for target in self._targets)
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
        await self._http.aclose()
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
        """Play one rollout within its deadline (counted from when a concurrency slot frees up)."""
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
            except _Final as error:
                return self._failed(request, error.cause, str(error), attempts, started, last_target)
        if answer.cause is not None:
            outcome = self._failed(request, answer.cause, answer.error or "", attempts, started, last_target)
            return replace(outcome, metrics=answer.metrics)
        assert answer.rewards is not None
        return RolloutOutcome(
            rollout_id=request.rollout_id,
            group_index=request.group_index,
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
        return self.retry_backoff_s * 2 ** (attempt - 1) * self._jitter.uniform(0.5, 1.0)

    async def _attempt(self, target: _Target, request: RolloutRequest, body: bytes) -> _Answer:
        target.outstanding += 1
        target.dispatched += 1
        try:
            if is_agent_runtime_arn(target.address):
                return await self._invoke_runtime(target.address, request, body)
            return await self._post(target.address, body)
        finally:
            target.outstanding -= 1

    # --- http(s) targets

    async def _post(self, url: str, body: bytes) -> _Answer:
        endpoint = url if url.endswith("/invocations") else f"{url}/invocations"
        try:
            response = await self._http.post(
                endpoint, content=body, headers={"Content-Type": "application/json"}
            )
        except httpx.TransportError as error:
            raise _Retryable(f"{type(error).__name__} from {endpoint}: {error}") from None
        if response.status_code in RETRYABLE_STATUS:
            raise _Retryable(f"{_error_text(response.status_code, response.content)} from {endpoint}")
        if response.status_code >= 400:
            raise _Final(FailureCause.AGENT_ERROR, _error_text(response.status_code, response.content))
        return _read_answer(response.content)

    # --- AgentCore runtime targets

    def _default_agentcore_client(self, region: str) -> Any:
        config = BotoConfig(
            retries={"total_max_attempts": 1},  # retries are ours, within the deadline
            read_timeout=self.rollout_timeout_s,
            connect_timeout=min(self.rollout_timeout_s, 30.0),
        )
        return boto3.client("bedrock-agentcore", region_name=region, config=config)

    def _agentcore_client(self, arn: str) -> Any:
        region = self.aws_region or arn.split(":")[3]
        if region not in self._agentcore_clients:
            self._agentcore_clients[region] = self._client_factory(region)
        return self._agentcore_clients[region]

    async def _invoke_runtime(self, arn: str, request: RolloutRequest, body: bytes) -> _Answer:
        client = self._agentcore_client(arn)
        params: dict[str, Any] = {
            "agentRuntimeArn": arn,
            "runtimeSessionId": runtime_session_id(request.rollout_id),
            "payload": body,
            "contentType": "application/json",
            "accept": "application/json",
        }
        if self.agent_qualifier is not None:
            params["qualifier"] = self.agent_qualifier

        def invoke() -> tuple[int, bytes]:
            response = client.invoke_agent_runtime(**params)
            return int(response.get("statusCode", 200)), response["response"].read()

        assert self._executor is not None
        try:
            status, content = await asyncio.get_running_loop().run_in_executor(self._executor, invoke)
        except ClientError as error:
            code = error.response.get("Error", {}).get("Code", "")
            status = error.response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0)
            message = f"{code or 'error'} from {arn}: {error.response.get('Error', {}).get('Message', error)}"
            if code in _RETRYABLE_AWS_CODES or status in RETRYABLE_STATUS:
                raise _Retryable(message) from None
            raise _Final(FailureCause.AGENT_ERROR, message) from None
        except (EndpointConnectionError, ConnectionClosedError, ReadTimeoutError) as error:
            raise _Retryable(f"{type(error).__name__} from {arn}: {error}") from None
        except BotoCoreError as error:
            raise _Final(FailureCause.AGENT_ERROR, f"{type(error).__name__} calling {arn}: {error}") from None
        if status in RETRYABLE_STATUS:
            raise _Retryable(f"{_error_text(status, content)} from {arn}")
        if status >= 400:
            raise _Final(FailureCause.AGENT_ERROR, _error_text(status, content))
        return _read_answer(content)
