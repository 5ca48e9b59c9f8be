"""Calling an agent, one way for every caller: ``rft smoke``, the trainer's fan-out and its config checks.

A target is an http(s) base URL (``POST {url}/invocations``) or an AgentCore runtime ARN
(``invoke_agent_runtime`` in the ARN's region). Whatever the transport, an answer is read into one
:class:`AgentAnswer`: the rewards of a finished rollout, or the cause and text of a failure. Agent side
(no torch): ``rft smoke`` runs where the agent runs.
"""

from __future__ import annotations

import json
import math
import random
import re
import socket
import uuid
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any
from urllib.parse import urlsplit
from urllib.request import getproxies, proxy_bypass

from handlers.protocol import ResultStatus

RUNTIME_ARN_PATTERN = re.compile(
    r"^arn:aws[a-z-]*:bedrock-agentcore:[a-z0-9-]+:\d{12}:runtime/[A-Za-z0-9_-]+$"
)
RUNTIME_ARN_FORM = "arn:aws:bedrock-agentcore:REGION:ACCOUNT:runtime/NAME"
# HTTP answers that mean "the agent is there but cannot take this now": worth another attempt.
RETRYABLE_STATUS = frozenset({429, 502, 503, 504})
RETRYABLE_AWS_CODES = frozenset({"ThrottlingException", "RetryableConflictException", "ServiceUnavailable"})
ERROR_TEXT_CHARS = 500
_SESSION_NAMESPACE = uuid.UUID("5b0c3c5e-7f0e-4a55-9d8a-2f1b6f3f0a11")


def retry_delay(first_s: float, attempt: int, jitter: random.Random) -> float:
    """The wait before the ``attempt``-th retry of a call that failed in transport: ``first_s``, doubled
    on every retry after the first, times a random factor from a half to one so that callers failing
    together spread out. Every bounded retry of an HTTP call in rftkit waits this long (agent calls,
    a distillation teacher's)."""
    return first_s * 2 ** (attempt - 1) * jitter.uniform(0.5, 1.0)


class FailureCause(StrEnum):
    """Why a rollout gives no reward."""

    AGENT_ERROR = "agent_error"  # the agent answered 4xx/5xx (not 429/502-504) or reported itself failed
    TIMEOUT = "timeout"  # the rollout's deadline passed
    TRANSPORT = "transport"  # refused, reset, closed, 429, 502-504, still failing after the retries
    BAD_REWARD = "bad_reward"  # a reward that is NaN, infinite or not a number
    BAD_RESPONSE = "bad_response"  # a 200 answer that is not a rollout result
    SKIPPED = "skipped"  # the agent skipped the row ({"status": "skipped"})
    NO_REPORT = "no_report"  # the agent finished but reported no reward, neither answer nor update-reward
    MODEL_CALLS_REFUSED = "model_calls_refused"  # every model call it made was refused (401, 4xx)
    NO_MODEL_CALLS = "no_model_calls"  # the agent answered without calling the model: nothing to train on
    STALLED = "stalled"  # the stall watchdog failed it (faults.stall_timeout_s, on_stall_timeout)


# --- targets ---------------------------------------------------------------------------------------


def is_runtime_arn(target: str) -> bool:
    """Whether ``target`` is an AgentCore runtime ARN (anything else must be an http(s) URL)."""
    return RUNTIME_ARN_PATTERN.match(target) is not None


def arn_region(arn: str) -> str:
    return arn.split(":")[3]


def invocations_url(target: str) -> str:
    """``{target}/invocations``, unless the URL already ends there."""
    target = target.rstrip("/")
    return target if target.endswith("/invocations") else f"{target}/invocations"


def unreachable(target: str, *, timeout_s: float = 5.0) -> str | None:
    """Why nothing can be connected to at the agent URL ``target`` (nothing listens there, its host is
    unknown or out of reach), in a sentence; None when a connection opens, for AgentCore ARNs, and
    for a URL the environment sends through a proxy.

    A TCP connect only: whether the server there is the agent, and answers, is for the calls to show.
    """
    if is_runtime_arn(target):
        return None
    url = urlsplit(target)
    host = url.hostname or ""
    if getproxies().get(url.scheme) and not proxy_bypass(host):
        return None  # reached through a proxy (as httpx's calls are): a direct connect proves nothing
    port = url.port or (443 if url.scheme == "https" else 80)
    try:
        with socket.create_connection((host, port), timeout=timeout_s):
            return None
    except ConnectionRefusedError:
        return f"nothing listens at {target} (connection refused)"
    except socket.gaierror as error:
        return f"the host {host!r} of {target} is not found ({error.strerror})"
    except TimeoutError:
        return f"{target} accepted no connection within {timeout_s:g} s (a firewall, or the wrong host)"
    except OSError as error:
        return f"{target} cannot be reached: {error.strerror or error}"


def runtime_session_id(rollout_id: str) -> str:
    """The AgentCore session id of a rollout: stable, 39 characters (the service wants 33 to 256)."""
    return f"rftkit-{uuid.uuid5(_SESSION_NAMESPACE, rollout_id).hex}"


# --- AgentCore -------------------------------------------------------------------------------------


def agentcore_client(region: str, *, read_timeout_s: float, connect_timeout_s: float = 30.0) -> Any:
    """A boto3 ``bedrock-agentcore`` client making one attempt per call (callers own their retries)."""
    import boto3
    from botocore.config import Config

    config = Config(
        retries={"total_max_attempts": 1},
        read_timeout=read_timeout_s,
        connect_timeout=min(read_timeout_s, connect_timeout_s),
    )
    return boto3.client("bedrock-agentcore", region_name=region, config=config)


def invoke_runtime(
    client: Any, arn: str, body: bytes, *, session_id: str, qualifier: str | None = None
) -> tuple[int, bytes]:
    """One ``invoke_agent_runtime`` call (blocking): the agent's HTTP status and body.

    botocore's exceptions propagate; :func:`client_error_answer` reads a ``ClientError``.
    """
    params: dict[str, Any] = {
        "agentRuntimeArn": arn,
        "runtimeSessionId": session_id,
        "payload": body,
        "contentType": "application/json",
        "accept": "application/json",
    }
    if qualifier:
        params["qualifier"] = qualifier
    response = client.invoke_agent_runtime(**params)
    return int(response.get("statusCode") or 200), response["response"].read()


# --- reading answers -------------------------------------------------------------------------------


@dataclass(frozen=True)
class AgentAnswer:
    """What an agent (or AgentCore in front of it) answered: rewards, or a failure's cause and text."""

    cause: FailureCause | None
    rewards: list[float] | None = None
    metrics: dict[str, float] = field(default_factory=dict)
    error: str | None = None
    status_code: int = 200
    aws_code: str | None = None  # the AWS error code, when AgentCore itself refused the call

    @property
    def retryable(self) -> bool:
        return self.status_code in RETRYABLE_STATUS or self.aws_code in RETRYABLE_AWS_CODES

    @property
    def access_denied(self) -> bool:
        return self.status_code == 403 or self.aws_code == "AccessDeniedException"


def error_message(body: bytes) -> str:
    """The ``error`` field of a JSON error body, else the body's text (shortened)."""
    try:
        parsed = json.loads(body)
    except (ValueError, UnicodeDecodeError):
        return body[:ERROR_TEXT_CHARS].decode("utf-8", "replace") or "(empty body)"
    if isinstance(parsed, dict) and "error" in parsed:
        return str(parsed["error"])[:ERROR_TEXT_CHARS]
    return json.dumps(parsed)[:ERROR_TEXT_CHARS]


def read_answer(status_code: int, body: bytes) -> AgentAnswer:
    """Classify an HTTP answer of ``/invocations``: an error status, or a 200 read by :func:`read_result`."""
    if status_code >= 400:
        cause = FailureCause.TRANSPORT if status_code in RETRYABLE_STATUS else FailureCause.AGENT_ERROR
        error = f"HTTP {status_code}: {error_message(body)}"
        return AgentAnswer(cause, error=error, status_code=status_code)
    return read_result(body)


def client_error_answer(response: dict[str, Any]) -> AgentAnswer:
    """Classify AgentCore's refusal (a botocore ``ClientError``'s ``response``)."""
    code = response.get("Error", {}).get("Code") or "error"
    status_code = int(response.get("ResponseMetadata", {}).get("HTTPStatusCode") or 0)
    error = f"{code} (HTTP {status_code}): {response.get('Error', {}).get('Message', '')}"
    retryable = status_code in RETRYABLE_STATUS or code in RETRYABLE_AWS_CODES
    cause = FailureCause.TRANSPORT if retryable else FailureCause.AGENT_ERROR
    return AgentAnswer(cause, error=error, status_code=status_code, aws_code=code)


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def read_result(body: bytes) -> AgentAnswer:
    """Classify a 200 answer: the shapes ``rft_handler`` and the service's own handlers return."""
    try:
        result = json.loads(body)
    except (json.JSONDecodeError, UnicodeDecodeError):
        return AgentAnswer(FailureCause.BAD_RESPONSE, error=f"the answer is not JSON: {body[:200]!r}")
    if _is_number(result) or isinstance(result, list):
        return _rewards_answer(result, {})
    if not isinstance(result, dict):
        return AgentAnswer(
            FailureCause.BAD_RESPONSE, error=f"the answer is not a rollout result: {result!r:.200}"
        )
    status = result.get("status", ResultStatus.READY.value)
    if status == ResultStatus.SKIPPED.value:
        return AgentAnswer(FailureCause.SKIPPED, error="the agent skipped the row")
    if status in (ResultStatus.FAILED.value, "error"):
        error = str(result.get("error") or "the agent reported failure")[:ERROR_TEXT_CHARS]
        return AgentAnswer(FailureCause.AGENT_ERROR, error=error)
    if status != ResultStatus.READY.value:
        return AgentAnswer(FailureCause.BAD_RESPONSE, error=f"unknown rollout status {status!r}")
    metrics = result.get("metrics") or {}
    if not isinstance(metrics, dict):
        metrics = {}
    numeric = {str(k): float(v) for k, v in metrics.items() if _is_number(v) or isinstance(v, bool)}
    rewards = result.get("rewards")
    if rewards is None:
        rewards = result.get("reward")
    if rewards is None:
        return AgentAnswer(FailureCause.NO_REPORT, metrics=numeric, error="the answer carries no reward")
    return _rewards_answer(rewards, numeric)


def _rewards_answer(value: Any, metrics: dict[str, float]) -> AgentAnswer:
    values = value if isinstance(value, list) else [value]
    if not values:
        return AgentAnswer(FailureCause.BAD_REWARD, error="the answer's reward list is empty")
    if not all(_is_number(item) and math.isfinite(item) for item in values):
        return AgentAnswer(
            FailureCause.BAD_REWARD, error=f"the answer's reward is not finite: {value!r:.200}"
        )
    return AgentAnswer(None, rewards=[float(item) for item in values], metrics=metrics)
