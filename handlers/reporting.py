"""Feedback posts from the agent to the policy endpoint: ``update-reward`` and ``complete-rollout``.

The HTTP answer on ``/invocations`` already carries the result, so a report that cannot be delivered
is logged and never raised: it must not turn a played rollout into a failed one.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

import httpx
from pydantic import BaseModel

from handlers.context import shared_ssl_context
from handlers.protocol import (
    COMPLETE_ROLLOUT_PATH,
    JOB_ARN_HEADER,
    TRAJECTORY_ID_HEADER,
    UPDATE_REWARD_PATH,
    CompleteRolloutRequest,
    RolloutStatus,
    UpdateRewardRequest,
)

logger = logging.getLogger(__name__)

# A lost report turns a played rollout into a failure, so the numbers would depend on load: on 2 cores
# at a load average of 20, connecting to the trainer took longer than 5 s (ConnectTimeout).
REPORT_TIMEOUT_S = 30.0


def _headers(job_arn: str, rollout_id: str, api_key: str | None) -> dict[str, str]:
    """The rollout's attribution headers travel with its reports too, as with its model calls."""
    headers = {JOB_ARN_HEADER: job_arn, TRAJECTORY_ID_HEADER: rollout_id}
    if api_key:
        headers["Authorization"] = f"Bearer {api_key}"
    return headers


def _reports(
    job_arn: str, rollout_id: str, status: RolloutStatus, rewards: Sequence[float] | None
) -> list[tuple[str, BaseModel]]:
    """The posts to make, in order: the rewards (when there are any), then the completion."""
    reports: list[tuple[str, BaseModel]] = []
    if rewards is not None:
        reports.append(
            (
                UPDATE_REWARD_PATH,
                UpdateRewardRequest(JobArn=job_arn, TrajectoryId=rollout_id, Rewards=list(rewards)),
            )
        )
    reports.append(
        (
            COMPLETE_ROLLOUT_PATH,
            CompleteRolloutRequest(JobArn=job_arn, TrajectoryId=rollout_id, Status=status),
        )
    )
    return reports


def _log_failure(url: str, rollout_id: str, problem: str) -> None:
    logger.warning("could not report rollout %s to %s: %s", rollout_id, url, problem)


_Prepared = tuple[httpx.Headers, list[tuple[str, dict[str, Any]]]]


def _prepare(
    endpoint: str,
    job_arn: str,
    rollout_id: str,
    status: RolloutStatus,
    rewards: Sequence[float] | None,
    api_key: str | None,
) -> _Prepared | None:
    """The headers and (url, body) posts, or None (logged) when they cannot even be formed."""
    try:
        headers = httpx.Headers(_headers(job_arn, rollout_id, api_key))
        posts = [
            (f"{endpoint}{path}", body.model_dump(mode="json"))
            for path, body in _reports(job_arn, rollout_id, status, rewards)
        ]
    except ValueError as exc:  # ids unfit for headers (UnicodeEncodeError), rewards that are no numbers
        _log_failure(endpoint, rollout_id, f"{type(exc).__name__}: {exc}")
        return None
    return headers, posts


def _check(response: httpx.Response, rollout_id: str) -> None:
    if response.status_code >= 400:
        _log_failure(str(response.url), rollout_id, f"HTTP {response.status_code}: {response.text[:200]}")


def report_rollout(
    endpoint: str,
    job_arn: str,
    rollout_id: str,
    status: RolloutStatus,
    rewards: Sequence[float] | None = None,
    *,
    api_key: str | None = None,
    timeout: float = REPORT_TIMEOUT_S,
) -> None:
    """Post the rewards (if any) and then the rollout's completion status; never raises."""
    prepared = _prepare(endpoint, job_arn, rollout_id, status, rewards, api_key)
    if prepared is None:
        return
    headers, posts = prepared
    with httpx.Client(timeout=timeout, headers=headers, verify=shared_ssl_context()) as client:
        for url, body in posts:
            try:
                _check(client.post(url, json=body), rollout_id)
            except Exception as exc:  # a report must never fail the rollout
                _log_failure(url, rollout_id, f"{type(exc).__name__}: {exc}")


async def report_rollout_async(
    endpoint: str,
    job_arn: str,
    rollout_id: str,
    status: RolloutStatus,
    rewards: Sequence[float] | None = None,
    *,
    api_key: str | None = None,
    timeout: float = REPORT_TIMEOUT_S,
) -> None:
    """The asynchronous twin of :func:`report_rollout`; never raises."""
    prepared = _prepare(endpoint, job_arn, rollout_id, status, rewards, api_key)
    if prepared is None:
        return
    headers, posts = prepared
    async with httpx.AsyncClient(timeout=timeout, headers=headers, verify=shared_ssl_context()) as client:
        for url, body in posts:
            try:
                _check(await client.post(url, json=body), rollout_id)
            except Exception as exc:  # a report must never fail the rollout
                _log_failure(url, rollout_id, f"{type(exc).__name__}: {exc}")
