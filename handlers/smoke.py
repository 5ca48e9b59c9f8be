"""``rft smoke TARGET``: prove a deployed agent parses its payload, calls its model and reports, before any
GPU time is spent.

For an agent URL, ``rft smoke`` serves, for the length of the check, the policy endpoint it writes into
the payload: every model call is answered ``400 Could not find job`` (no job of that id is served), and
the calls' headers and the feedback posts are recorded. The endpoint demands the credential a run
would (an API key handed in the payload, or SageMaker tokens with --accept-sagemaker-tokens) and says
which one the agent sent. A healthy agent comes back with its no-play reward, having called the model
with the rollout's headers and credential and reported that reward. For an AgentCore
runtime ARN the agent cannot reach this machine, so the report lists what could not be verified.

Exit codes: 0 healthy; 1 the agent answered but something is missing (partial); 2 the check could not
run (bad arguments, payload file or AWS credentials); 3 the agent (or AgentCore) answered an error;
4 access denied (403, or a credential a run would refuse: 401); 5 the agent is not reachable
(connection refused or no answer in time).
"""

from __future__ import annotations

import json
import math
import time
import uuid
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import Any

import httpx

from handlers.agent_client import (
    AgentAnswer,
    agentcore_client,
    arn_region,
    client_error_answer,
    error_message,
    invocations_url,
    invoke_runtime,
    read_answer,
    runtime_session_id,
    unreachable,
)
from handlers.protocol import (
    JOB_ARN_HEADER,
    JOB_NOT_FOUND_MESSAGE,
    TRAJECTORY_ID_HEADER,
    RftkitExtras,
    RolloutMetadata,
    RolloutPayload,
)
from handlers.serving import serve_in_thread
from handlers.smoke_endpoint import Demand, Recording, credential_line, credential_verdict, recording_app

DEFAULT_PAYLOAD_PATH = Path("payloads") / "smoke.json"
DEFAULT_TIMEOUT_S = 60.0
# Reports an agent posts after answering still count if they arrive within this grace period.
REPORT_GRACE_S = 1.0

BUILTIN_PAYLOAD: dict[str, Any] = {
    "prompt": "{}",
    "metadata": {
        "jobArn": "arn:aws:sagemaker:us-east-1:000000000000:training-job/rftkit-smoke",
        "rolloutId": "rftkit-smoke-0",
    },
    "inferenceParams": {"temperature": 1.0, "maxTokens": 256},
}

HEALTHY_SENTENCE = (
    "parsing, authentication and error reporting work; start a training job to get real rollouts"
)
NOT_STARTING_SENTENCE = (
    "the server is not starting: is app.run() called, is the entrypoint outermost, is the port 8080?"
)
# Without --model every model call is refused, so the agent never plays: said in every such report.
NO_EPISODE_PLAYED = (
    "the agent's play: no episode was played (every model call was answered 400), so tools or a reward "
    "that fail once the model answers pass here; --model DIR plays real episodes against a local model "
    "(`rft model tiny DIR` builds one)"
)
ACCESS_DENIED_SENTENCE = "access denied (403): the ARN or key belongs to another account or job"
# What botocore-based signers (AWS's sagemaker-train SDK) say when the agent's environment has no keys.
NO_CREDENTIALS_MARKER = "No AWS credentials found"
CREDENTIALS_SENTENCE = (
    "agents built on AWS's sagemaker-train SDK sign every report (and often every model call) with AWS "
    "credentials, so give the agent's environment some: any, for a local run (AWS_ACCESS_KEY_ID, "
    "AWS_SECRET_ACCESS_KEY, AWS_REGION), and start the policy server with accept_sagemaker_tokens"
)


class Outcome(StrEnum):
    HEALTHY = "healthy"
    PARTIAL = "partial"
    AGENT_ERROR = "agent error"
    ACCESS_DENIED = "access denied"
    NOT_REACHABLE = "not reachable"


EXIT_CODES = {
    Outcome.HEALTHY: 0,
    Outcome.PARTIAL: 1,
    Outcome.AGENT_ERROR: 3,
    Outcome.ACCESS_DENIED: 4,
    Outcome.NOT_REACHABLE: 5,
}
EXIT_CANNOT_RUN = 2


@dataclass
class SmokeReport:
    """What the check saw and what it means."""

    target: str
    outcome: Outcome
    verdict: str
    observations: list[str] = field(default_factory=list)
    unverified: list[str] = field(default_factory=list)
    reward: float | None = None

    @property
    def exit_code(self) -> int:
        return EXIT_CODES[self.outcome]

    def render(self) -> str:
        lines = [f"rft smoke {self.target}"]
        lines += [f"  {line}" for line in self.observations]
        lines += [f"  not verified: {line}" for line in self.unverified]
        lines.append(f"{self.outcome.value.upper()}: {self.verdict}")
        return "\n".join(lines)


# --- reading the agent's answer --------------------------------------------------------------------


def _reward(answer: AgentAnswer) -> float | None:
    """The episode reward of a 200 answer (a per-turn list adds up), or None when it carries none."""
    return math.fsum(answer.rewards) if answer.cause is None and answer.rewards else None


def _without_reward(target: str, answer: AgentAnswer, body: bytes) -> SmokeReport:
    observations = [f"agent answered HTTP {answer.status_code}: {body[:500].decode('utf-8', 'replace')}"]
    verdict = "the agent answered without a reward: the rollout function must return its reward"
    if answer.error:
        verdict += f" ({answer.error})"
    return SmokeReport(target, Outcome.PARTIAL, verdict, observations)


def _agent_error(target: str, status_code: int, body: bytes) -> SmokeReport:
    error = error_message(body)
    observations = [f"agent answered HTTP {status_code}: {error}"]
    if status_code == 403:
        return SmokeReport(target, Outcome.ACCESS_DENIED, ACCESS_DENIED_SENTENCE, observations)
    if NO_CREDENTIALS_MARKER in error:
        verdict = f"the agent found no AWS credentials to sign with: {CREDENTIALS_SENTENCE}"
    elif JOB_NOT_FOUND_MESSAGE in error:
        verdict = (
            f"the agent reached the model endpoint, which answered '{JOB_NOT_FOUND_MESSAGE}', but let "
            "that error escape: catch the model's 400 and return the no-play reward"
        )
    else:
        verdict = f"the agent's own error (HTTP {status_code}), shown above: fix it and run rft smoke again"
    return SmokeReport(target, Outcome.AGENT_ERROR, verdict, observations)


def _matches(record: Any, job_arn: str, rollout_id: str) -> bool:
    return (
        isinstance(record, dict)
        and record.get("JobArn") == job_arn
        and record.get("TrajectoryId") == rollout_id
    )


def _sums_to(rewards: Any, total: float) -> bool:
    if not isinstance(rewards, list) or not all(isinstance(item, int | float) for item in rewards):
        return False
    return math.isclose(math.fsum(rewards), total, rel_tol=1e-9, abs_tol=1e-9)


def _judge_recording(
    target: str, payload: RolloutPayload, reward: float, recording: Recording
) -> SmokeReport:
    job_arn, rollout_id = payload.metadata.job_arn, payload.metadata.rollout_id
    observations = [f"agent answered HTTP 200 with reward {reward:g}"]
    missing = []

    calls = recording.model_call_headers
    attributed = [
        h
        for h in calls
        if h.get(JOB_ARN_HEADER.lower()) == job_arn and h.get(TRAJECTORY_ID_HEADER.lower()) == rollout_id
    ]
    observations.append(
        f"model endpoint: {len(calls)} call(s), {len(attributed)} with this rollout's "
        f"{JOB_ARN_HEADER} and {TRAJECTORY_ID_HEADER} headers, answered 400 '{JOB_NOT_FOUND_MESSAGE}'"
    )
    if not calls:
        missing.append(
            "the agent never called the model endpoint from the payload's metadata.endpoint: build its "
            "model with ctx.strands_model() or ctx.openai_client()"
        )
    elif not attributed:
        missing.append(
            "the model calls lacked this rollout's headers: build the model client from ctx "
            "(ctx.strands_model(), ctx.openai_client()), which carries them"
        )

    rewards = [r.get("Rewards") for r in recording.update_rewards if _matches(r, job_arn, rollout_id)]
    completions = [r.get("Status") for r in recording.complete_rollouts if _matches(r, job_arn, rollout_id)]
    observations.append(f"update-reward: {rewards or 'none'}; complete-rollout: {completions or 'none'}")
    if not rewards:
        missing.append(
            "no update-reward for this rollout arrived: return the reward from an @rft_handler (an agent "
            f"on AWS's SDK that logs '{NO_CREDENTIALS_MARKER}' could not sign its reports: "
            f"{CREDENTIALS_SENTENCE})"
        )
    elif not any(_sums_to(reported, reward) for reported in rewards):
        missing.append(f"the reported rewards {rewards} do not add up to the answered reward {reward:g}")
    if "ready" not in completions:
        missing.append(
            "no complete-rollout 'ready' for this rollout arrived: return the reward from an @rft_handler"
        )

    if missing:
        return SmokeReport(target, Outcome.PARTIAL, "; ".join(missing), observations, reward=reward)
    verdict = (
        f"the agent came back with its no-play reward {reward:g} because the model endpoint answered "
        f"400 '{JOB_NOT_FOUND_MESSAGE}' (no job of that id is served): {HEALTHY_SENTENCE}"
    )
    return SmokeReport(target, Outcome.HEALTHY, verdict, observations, reward=reward)


def _wait_for_reports(recording: Recording, grace_s: float) -> None:
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline and not (recording.update_rewards and recording.complete_rollouts):
        time.sleep(0.02)


def with_endpoint(payload: RolloutPayload, endpoint: str) -> RolloutPayload:
    """The payload with its ``metadata.endpoint`` replaced (validated like any endpoint)."""
    metadata = payload.metadata.model_dump(by_alias=True)
    return payload.model_copy(
        update={"metadata": RolloutMetadata.model_validate({**metadata, "endpoint": endpoint})}
    )


def smoke_url(
    target: str, payload: RolloutPayload, *, timeout: float = DEFAULT_TIMEOUT_S, demand: Demand | None = None
) -> SmokeReport:
    """Check an agent served over HTTP, serving its policy endpoint from this process meanwhile.

    ``demand``: the credential the endpoint demands, as the run's ``policy_server`` settings would (its
    API key goes to the agent in the payload, as a run hands it); None demands none.
    """
    demand = demand or Demand()
    recording = Recording()
    with serve_in_thread(recording_app(recording, demand)) as endpoint:
        sent = with_api_key(with_endpoint(payload, endpoint), demand.api_key)
        try:
            response = httpx.post(invocations_url(target), json=sent.to_wire(), timeout=timeout)
        except httpx.ConnectError as exc:
            observations = [f"could not connect to {invocations_url(target)}: {exc}"]
            return SmokeReport(target, Outcome.NOT_REACHABLE, _not_connected(target), observations)
        except httpx.TimeoutException:
            observations = [f"no answer from {invocations_url(target)} within {timeout:g} s"]
            return SmokeReport(target, Outcome.NOT_REACHABLE, NOT_STARTING_SENTENCE, observations)
        except httpx.TransportError as exc:
            observations = [f"the connection to {invocations_url(target)} broke: {type(exc).__name__}: {exc}"]
            verdict = "the agent dropped the request without an answer (did it crash?): see the agent's log"
            return SmokeReport(target, Outcome.AGENT_ERROR, verdict, observations)
        report = _judge_answer(target, payload, response, recording)
        refused = credential_verdict(recording, demand)
        if refused is not None:
            report = SmokeReport(target, Outcome.ACCESS_DENIED, refused, report.observations[:1])
        report.observations.append(credential_line(recording, demand))
        return report


def _not_connected(target: str) -> str:
    """The verdict when no connection to the agent opened: nothing there (the URL, or the agent not
    started), else a server that is not up yet."""
    reason = unreachable(target)
    if reason is None:
        return NOT_STARTING_SENTENCE
    return f"{reason}: check the URL's host and port, and that the agent runs there (python main.py)"


def _judge_answer(
    target: str, payload: RolloutPayload, response: httpx.Response, recording: Recording
) -> SmokeReport:
    if response.status_code >= 400:
        return _agent_error(target, response.status_code, response.content)
    answer = read_answer(response.status_code, response.content)
    reward = _reward(answer)
    if reward is None:
        return _without_reward(target, answer, response.content)
    _wait_for_reports(recording, REPORT_GRACE_S)
    return _judge_recording(target, payload, reward, recording)


def with_api_key(payload: RolloutPayload, api_key: str | None) -> RolloutPayload:
    """The payload handing the agent ``api_key`` as a run does (``rftkit.apiKey``); other extras kept."""
    if api_key is None:
        return payload
    extras = payload.rftkit or RftkitExtras()
    return payload.model_copy(update={"rftkit": extras.model_copy(update={"api_key": api_key})})


# --- AgentCore runtime ARNs ------------------------------------------------------------------------

UNVERIFIABLE_REMOTELY = [
    "that the agent called the model endpoint with the rollout's headers",
    "that it posted update-reward and complete-rollout",
    "that its calls carry the credential a run demands",
]
REMOTE_VERDICT = (
    "the agent parses its payload and returns a reward; the runtime cannot reach this machine, so run the "
    "same image locally and `rft smoke http://localhost:8080` to verify the rest"
)


def smoke_arn(
    arn: str,
    payload: RolloutPayload,
    *,
    timeout: float = DEFAULT_TIMEOUT_S,
    qualifier: str | None = None,
    client: Any = None,
) -> SmokeReport:
    """Check an agent on AgentCore Runtime through ``invoke_agent_runtime``."""
    from botocore.exceptions import (
        ClientError,
        ConnectTimeoutError,
        EndpointConnectionError,
        ReadTimeoutError,
    )

    if client is None:
        client = agentcore_client(arn_region(arn), read_timeout_s=timeout, connect_timeout_s=10.0)
    body = json.dumps(payload.to_wire()).encode()
    try:
        # AgentCore wants a session id of 33 to 256 characters.
        status_code, content = invoke_runtime(
            client, arn, body, session_id=runtime_session_id(f"smoke-{uuid.uuid4().hex}"), qualifier=qualifier
        )
    except ClientError as exc:
        refusal = client_error_answer(exc.response)
        observations = [f"AgentCore answered {refusal.error}"]
        if refusal.access_denied:
            return SmokeReport(arn, Outcome.ACCESS_DENIED, ACCESS_DENIED_SENTENCE, observations)
        verdict = (
            "the runtime or the agent in it answered an error, shown above: fix it and run rft smoke again"
        )
        return SmokeReport(arn, Outcome.AGENT_ERROR, verdict, observations)
    except (ReadTimeoutError, ConnectTimeoutError, EndpointConnectionError) as exc:
        observations = [f"no answer from AgentCore within {timeout:g} s: {exc}"]
        return SmokeReport(arn, Outcome.NOT_REACHABLE, NOT_STARTING_SENTENCE, observations)
    if status_code >= 400:
        return _agent_error(arn, status_code, content)
    answer = read_answer(status_code, content)
    reward = _reward(answer)
    if reward is None:
        return _without_reward(arn, answer, content)
    observations = [f"agent answered HTTP {status_code} with reward {reward:g}"]
    return SmokeReport(
        arn, Outcome.HEALTHY, REMOTE_VERDICT, observations, list(UNVERIFIABLE_REMOTELY), reward
    )
