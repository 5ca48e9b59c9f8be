"""The policy endpoint ``rft smoke`` serves while it checks a local agent.

It serves no job: every model call is answered ``400 Could not find job`` (OpenAI's error shape), as
the real policy server answers for a job it does not know. Before that, every call and feedback post
must carry the credential a run would demand (:func:`handlers.credentials.agent_refusal`: the API key
the payload hands the agent, or with ``accept_sagemaker_tokens`` a SageMaker token), else it is
answered 401 with the gateway's sentence. The calls' headers, the credentials they carried, the
refusals and the feedback posts are recorded so the check can tell what the agent did.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from handlers.credentials import NO_CREDENTIAL, SAGEMAKER_TOKEN, agent_refusal, credential_sent
from handlers.protocol import (
    CHAT_COMPLETIONS_PATH,
    COMPLETE_ROLLOUT_PATH,
    JOB_NOT_FOUND_MESSAGE,
    UPDATE_REWARD_PATH,
)
from handlers.sagemaker_tokens import SageMakerTokenPolicy


@dataclass(frozen=True)
class Demand:
    """The credential the endpoint demands, as a run's ``policy_server`` settings would."""

    api_key: str | None = None
    sagemaker_tokens: SageMakerTokenPolicy | None = None

    def describe(self) -> str:
        if self.api_key is None and self.sagemaker_tokens is None:
            return "none (as a run with policy_server.api_key: none)"
        demanded = "the API key the payload handed the agent" if self.api_key is not None else ""
        if self.sagemaker_tokens is not None:
            demanded += " or " if demanded else ""
            demanded += "a SageMaker token (accept_sagemaker_tokens)"
        return demanded


@dataclass
class Recording:
    """What reached the smoke endpoint while the check ran."""

    model_call_headers: list[dict[str, str]] = field(default_factory=list)
    update_rewards: list[Any] = field(default_factory=list)
    complete_rollouts: list[Any] = field(default_factory=list)
    credentials: list[str] = field(default_factory=list)  # what each call and post carried, in words
    # What each refused call or post carried and the sentence of its 401.
    refusals: list[tuple[str, str]] = field(default_factory=list)


def recording_app(recording: Recording, demand: Demand | None = None) -> Starlette:
    """A policy endpoint that serves no job: model calls answer 400 ``Could not find job``; calls
    without the credential ``demand`` names answer 401."""
    demand = demand or Demand()

    def refusal(request: Request) -> str | None:
        authorization = request.headers.get("authorization", "")
        sent = credential_sent(authorization, demand.api_key)
        recording.credentials.append(sent)
        refused = agent_refusal(authorization, demand.api_key, demand.sagemaker_tokens)
        if refused is not None:
            recording.refusals.append((sent, refused))
        return refused

    async def chat_completions(request: Request) -> JSONResponse:
        recording.model_call_headers.append({key.lower(): value for key, value in request.headers.items()})
        refused = refusal(request)
        if refused is not None:
            error = {"message": refused, "type": "invalid_request_error", "code": 401}
            return JSONResponse({"error": error}, status_code=401)
        error = {"message": JOB_NOT_FOUND_MESSAGE, "type": "invalid_request_error", "code": 400}
        return JSONResponse({"error": error}, status_code=400)

    def feedback(records: list[Any]) -> Any:
        async def record(request: Request) -> JSONResponse:
            refused = refusal(request)
            if refused is not None:
                return JSONResponse({"error": refused}, status_code=401)
            try:
                records.append(await request.json())
            except ValueError:
                return JSONResponse({"error": "the body is not JSON"}, status_code=400)
            return JSONResponse({"status": "ok"})

        return record

    return Starlette(
        routes=[
            Route(CHAT_COMPLETIONS_PATH, chat_completions, methods=["POST"]),
            Route(UPDATE_REWARD_PATH, feedback(recording.update_rewards), methods=["POST"]),
            Route(COMPLETE_ROLLOUT_PATH, feedback(recording.complete_rollouts), methods=["POST"]),
        ]
    )


def credential_line(recording: Recording, demand: Demand) -> str:
    """What the agent's calls and posts carried, against what a run would demand."""
    sent = sorted(set(recording.credentials)) or [NO_CREDENTIAL + " (no request reached the endpoint)"]
    return f"credential the agent sent: {', '.join(sent)}; a run demands {demand.describe()}"


def credential_verdict(recording: Recording, demand: Demand) -> str | None:
    """Why a run would refuse this agent's calls (the endpoint answered them 401), or None."""
    if not recording.refusals:
        return None
    sent = {credential for credential, _ in recording.refusals}
    refusal = recording.refusals[0][1]
    if SAGEMAKER_TOKEN in sent and demand.sagemaker_tokens is None:
        return (
            "a run refuses the agent's calls (401): it signs them with SageMaker bearer tokens (AWS's "
            "SageMaker SDK), which a run takes only with policy_server.accept_sagemaker_tokens: true; "
            "set it and run rft smoke --accept-sagemaker-tokens"
        )
    if SAGEMAKER_TOKEN in sent:
        return f"a run refuses the agent's SageMaker token (401): {refusal}"
    return (
        f"a run refuses the agent's calls (401 '{refusal}'): they carried {' or '.join(sorted(sent))}, "
        "not the key the payload hands the agent (rftkit.apiKey); build the model client from ctx "
        "(ctx.strands_model(), ctx.openai_client()) and report through rft_app, which send it"
    )
