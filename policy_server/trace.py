"""What the policy server records: the exact tokens of every model call, grouped by rollout.

These records are the trainer's input. Nothing in them is re-derived from text: prompt ids are the
ids the engine was fed, completion ids and logprobs are what the sampler drew.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, Field

from policy_server.http.images import ImageRef

# How the recorded logprobs were computed. "raw": log-softmax of the model's logits, before
# temperature, top-p or any other processing (what the trainer recomputes). "processed": after them.
LogprobsMode = Literal["raw", "processed"]


# Text of a call's request messages kept in its record (for debugging; training reads only token ids).
# Fields a template never renders (a long reasoning_content, say) are bounded by nothing else, and
# every call of every open rollout holds its record.
RECORDED_TEXT_CHARS = 64 * 1024


def clipped_for_record(
    messages: list[dict[str, Any]], budget: int = RECORDED_TEXT_CHARS
) -> list[dict[str, Any]]:
    """A copy of ``messages`` holding at most ``budget`` characters of text, clipped strings marked."""
    remaining = budget

    def clip(value: Any) -> Any:
        nonlocal remaining
        if isinstance(value, str):
            kept = value[: max(remaining, 0)]
            remaining -= len(kept)
            return kept if len(kept) == len(value) else f"{kept}[... {len(value) - len(kept)} chars not kept]"
        if isinstance(value, dict):
            return {key: clip(item) for key, item in value.items()}
        if isinstance(value, list):
            return [clip(item) for item in value]
        return value

    return [clip(message) for message in messages]


class CallRecord(BaseModel):
    """One chat-completion call, as the engine saw it."""

    index: int = Field(description="Position of the call within its rollout, from 0.")
    prompt_token_ids: list[int]
    completion_token_ids: list[int]
    completion_logprobs: list[float] = Field(
        description="Logprob of each sampled completion token; same length as completion_token_ids."
    )
    logprobs_mode: LogprobsMode = "raw"
    adapter_version: int = Field(description="Adapter version that sampled the call; 0 is the base model.")
    finish_reason: str = Field(description="'stop', 'length' or 'tool_calls'.")
    started_at: float = Field(description="Unix time the gateway received the call.")
    finished_at: float = Field(description="Unix time the engine returned.")
    temperature: float = 1.0
    top_p: float = 1.0
    messages: list[dict[str, Any]] = Field(
        default_factory=list, description="Request messages, for debugging."
    )
    tools: list[dict[str, Any]] | None = None
    unparsed_tool_call: bool = Field(
        default=False,
        description="The completion holds a tool call that did not parse: a tool-call marker such as "
        "<tool_call> left in its content, a call whose arguments are not JSON or do not match the "
        "request's tools schema, or calls in a completion cut off by the token limit.",
    )
    unparsed_reason: str | None = Field(default=None, description="Why the call counts as unparsed.")
    truncated: bool = Field(
        default=False, description="The completion was cut off by the token limit (max_tokens)."
    )
    answered: bool = Field(
        default=True, description="The reply gave the agent content or a tool call (not reasoning only)."
    )
    images: list[ImageRef] = Field(
        default_factory=list,
        description="The prompt's images in order: sha256 (the bytes are in the run's image store) "
        "and the span of placeholder tokens each took in prompt_token_ids.",
    )
    answer: dict[str, Any] | None = Field(
        default=None,
        description="The reply as the engine parsed it (content, tool_calls), kept only for an engine "
        "that returns no token ids (a forwarded endpoint): the completion cannot be decoded from ids.",
    )


class RolloutTrace(BaseModel):
    """Every call of one rollout, in order, plus what the agent reported back."""

    job_arn: str
    rollout_id: str
    calls: list[CallRecord] = Field(default_factory=list)
    status: Literal["ready", "failed"] | None = Field(
        default=None, description="From POST /complete-rollout; None if the agent never reported."
    )
    rewards: list[float] | None = Field(default=None, description="From POST /update-reward, if any.")
    rejected_calls: int = Field(
        default=0, description="Calls answered with a 4xx past authentication (over caps, bad input)."
    )
    auth_refused_calls: int = Field(
        default=0, description="Calls the gateway refused for their credentials (401/403)."
    )
    first_refusal: str | None = Field(
        default=None, description="The first refused call's status and sentence: 'HTTP 401: ...'."
    )


class TokenCounters(BaseModel):
    """Per-job token counts, in the SageMaker cost model's buckets."""

    prefill_tokens: int = 0
    sample_tokens: int = 0
    calls: int = 0
    rejected_calls: int = 0
