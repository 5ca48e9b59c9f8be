"""The rollout wire protocol, defined once.

rftkit speaks the SageMaker AI Multi-Turn RL protocol so that an agent moves between that service
and rftkit unchanged. Three messages cross the wire:

1. trainer -> agent, ``POST /invocations``: a :class:`RolloutPayload`.
2. agent -> policy, ``POST {endpoint}/v1/chat/completions`` with the :data:`JOB_ARN_HEADER` and
   :data:`TRAJECTORY_ID_HEADER` headers (OpenAI chat completions; models live in ``policy_server``).
3. agent -> policy, ``POST {endpoint}/complete-rollout`` (:class:`CompleteRolloutRequest`) and
   ``POST {endpoint}/update-reward`` (:class:`UpdateRewardRequest`); the agent also answers
   ``/invocations`` with a :class:`RolloutResponse`.

Readers accept the aliases seen in the wild (``jobArn``/``job_arn``, ``rolloutId``/``trajectoryId``/
``trajectory_id``, ``inferenceParams``/``inference_params``, ``maxTokens``/``max_tokens``, ...).
Writers emit the service's own spelling. rftkit's own additions travel under the single key
:data:`RFTKIT_KEY`, which handlers written for the service ignore.
"""

from __future__ import annotations

import math
from enum import StrEnum
from typing import Any

from pydantic import AliasChoices, BaseModel, ConfigDict, Field, field_validator

from handlers.urls import http_url

JOB_ARN_HEADER = "X-Amzn-SageMaker-Job-Arn"
TRAJECTORY_ID_HEADER = "X-Amzn-SageMaker-Trajectory-Id"
RFTKIT_KEY = "rftkit"

COMPLETE_ROLLOUT_PATH = "/complete-rollout"
UPDATE_REWARD_PATH = "/update-reward"
CHAT_COMPLETIONS_PATH = "/v1/chat/completions"

# The message the policy endpoint answers (HTTP 400) for a job it is not serving. `rft smoke` relies
# on agents surfacing it; the policy server sends it verbatim.
JOB_NOT_FOUND_MESSAGE = "Could not find job"


def _header_safe(value: str) -> str:
    """Ids and keys travel in HTTP headers, which carry only visible ASCII (inner spaces allowed)."""
    if value != value.strip() or not all(" " <= char <= "~" for char in value):
        raise ValueError(
            "must be printable ASCII without leading or trailing spaces, because it is sent in HTTP headers"
        )
    return value


class RolloutMetadata(BaseModel):
    """Who this rollout belongs to and where its model lives."""

    model_config = ConfigDict(extra="allow", populate_by_name=True, serialize_by_alias=True)

    job_arn: str = Field(
        min_length=1,
        validation_alias=AliasChoices("jobArn", "job_arn", "JobArn"),
        serialization_alias="jobArn",
        description="The training job's ARN (or any job id); sent back in every header and report.",
    )
    rollout_id: str = Field(
        min_length=1,
        validation_alias=AliasChoices(
            "rolloutId", "rollout_id", "trajectoryId", "trajectory_id", "TrajectoryId"
        ),
        serialization_alias="rolloutId",
        description="This episode's id (the service calls it trajectory id in headers and reports).",
    )
    endpoint: str | None = Field(
        default=None,
        description="Base URL of the policy endpoint (no trailing /v1).",
    )
    region: str | None = Field(default=None, description="AWS region of the job, when on AWS.")

    @field_validator("job_arn", "rollout_id")
    @classmethod
    def _header_safe_ids(cls, value: str) -> str:
        return _header_safe(value)

    @field_validator("endpoint")
    @classmethod
    def _strip_endpoint(cls, value: str | None) -> str | None:
        if value is None:
            return None
        value = value.strip().rstrip("/")
        if value.endswith("/v1"):
            value = value[: -len("/v1")]
        return http_url(value, "endpoint")


class InferenceParams(BaseModel):
    """Sampling parameters the job wants the agent to use for every model call."""

    model_config = ConfigDict(extra="allow", populate_by_name=True, serialize_by_alias=True)

    temperature: float | None = Field(default=None, ge=0.0, le=10.0)
    max_tokens: int | None = Field(
        default=None,
        ge=1,
        validation_alias=AliasChoices("maxTokens", "max_tokens"),
        serialization_alias="maxTokens",
    )
    top_p: float | None = Field(
        default=None,
        gt=0.0,
        le=1.0,
        validation_alias=AliasChoices("topP", "top_p"),
        serialization_alias="topP",
    )

    seed: int | None = Field(
        default=None,
        description="rftkit: sampling seed for this rollout's calls, so that sampling does not depend "
        "on how concurrent calls are batched; the policy server mixes in each call's position in the "
        "rollout, so calls draw independently (the service sends none; agents pass it on as is).",
    )

    def openai_params(self) -> dict[str, Any]:
        """The same parameters spelled for ``chat.completions.create``."""
        params: dict[str, Any] = {}
        if self.seed is not None:
            params["seed"] = self.seed
        if self.temperature is not None:
            params["temperature"] = self.temperature
        if self.max_tokens is not None:
            params["max_tokens"] = self.max_tokens
        if self.top_p is not None:
            params["top_p"] = self.top_p
        return params


class RftkitExtras(BaseModel):
    """rftkit's own payload fields, under ``payload["rftkit"]``; other handlers ignore them."""

    model_config = ConfigDict(extra="allow")

    model: str | None = Field(
        default=None,
        description="Model name to request from the policy endpoint (default: 'default').",
    )
    api_key: str | None = Field(
        default=None,
        description="Bearer key for the policy endpoint, when it requires one.",
    )
    evaluation: bool = Field(default=False, description="True for evaluation rollouts.")
    timeout_s: float | None = Field(
        default=None,
        gt=0,
        le=86_400,
        description="Seconds the trainer waits for this rollout; the agent's model calls end by then.",
    )

    @field_validator("api_key")
    @classmethod
    def _header_safe_key(cls, value: str | None) -> str | None:
        return None if value is None else _header_safe(value)


class RolloutPayload(BaseModel):
    """The body of ``POST /invocations``: one episode to play."""

    model_config = ConfigDict(extra="allow", populate_by_name=True, serialize_by_alias=True)

    prompt: Any = Field(description="The dataset row, passed through uninterpreted.")
    metadata: RolloutMetadata
    inference_params: InferenceParams | None = Field(
        default=None,
        validation_alias=AliasChoices("inferenceParams", "inference_params"),
        serialization_alias="inferenceParams",
    )
    rftkit: RftkitExtras | None = None

    def to_wire(self) -> dict[str, Any]:
        """The JSON object to send, in the service's spelling."""
        return self.model_dump(mode="json", by_alias=True, exclude_none=True)


class RolloutStatus(StrEnum):
    READY = "ready"
    FAILED = "failed"


class CompleteRolloutRequest(BaseModel):
    """Body of ``POST {endpoint}/complete-rollout``."""

    model_config = ConfigDict(extra="allow")

    JobArn: str = Field(min_length=1)
    TrajectoryId: str = Field(min_length=1)
    Status: RolloutStatus


class UpdateRewardRequest(BaseModel):
    """Body of ``POST {endpoint}/update-reward``: one reward, or one per turn."""

    model_config = ConfigDict(extra="allow")

    JobArn: str = Field(min_length=1)
    TrajectoryId: str = Field(min_length=1)
    Rewards: list[float] = Field(min_length=1)

    @field_validator("Rewards")
    @classmethod
    def _finite(cls, rewards: list[float]) -> list[float]:
        for reward in rewards:
            if not math.isfinite(reward):
                raise ValueError("every reward must be a finite number")
        return rewards


class ResultStatus(StrEnum):
    READY = "ready"
    SKIPPED = "skipped"
    FAILED = "failed"


class RolloutResponse(BaseModel):
    """What the agent answers on ``/invocations`` (and what the trainer reads back).

    ``rewards`` holds what the rollout function returned (one value, or one per turn); ``reward`` is
    their sum, the episode reward by default. A skipped rollout carries neither; a failed one
    carries ``error``.
    """

    model_config = ConfigDict(extra="allow")

    status: ResultStatus
    reward: float | None = None
    rewards: list[float] | None = None
    metrics: dict[str, float] = Field(default_factory=dict)
    error: str | None = None
