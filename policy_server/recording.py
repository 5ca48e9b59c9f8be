"""One served call as the trace records it: the engine's exact ids and logprobs, the sampling
settings, and the request's messages (clipped, image data replaced by the images' hashes)."""

from __future__ import annotations

import copy
from typing import Any

from policy_server.engines.base import GenerationRequest, GenerationResult
from policy_server.http.images import ImageInput, ImageRef
from policy_server.models.families import tool_call_problem
from policy_server.trace import CallRecord, clipped_for_record

# Text that opens a tool call in the engines' formats (hermes, Mistral, Llama 3.x, gpt-oss, Gemma 4):
# left in a reply's content, the completion tried to call a tool and the parser did not make a call of
# it. gpt-oss's call end `<|call|>` is a stop token the content never holds; its recipient does.
TOOL_CALL_MARKERS = (
    "<tool_call>",
    "[TOOL_CALLS]",
    "<|python_tag|>",
    "<|call|>",
    "to=functions.",
    "<|tool_call>",
)


def looks_like_unparsed_tool_call(result: GenerationResult) -> bool:
    """Whether the reply's content still holds a tool-call marker: a call the parser did not take."""
    return any(marker in (result.content or "") for marker in TOOL_CALL_MARKERS)


def truncated(generation: GenerationRequest, result: GenerationResult) -> bool:
    """Whether the completion was cut off by the token limit. The engines answer ``tool_calls`` (as
    vLLM does) when they parsed a call out of a cut completion: the hf engine says whether it was
    cut; for one that cannot tell (vLLM), a completion with calls that filled ``max_tokens`` counts."""
    if result.finish_reason == "length":
        return True
    if result.finish_reason != "tool_calls":
        return False
    if result.truncated is not None:
        return result.truncated
    return len(result.completion_token_ids) >= generation.max_tokens


def unparsed_reason(generation: GenerationRequest, result: GenerationResult) -> str | None:
    """Why the reply holds a tool call that did not parse (a phrase), or None: a tool-call marker left
    in its content, a call whose arguments do not parse against the request's tools, or calls in a
    completion cut off by the token limit (the last one cut short)."""
    if looks_like_unparsed_tool_call(result):
        return "a tool-call marker is left in the reply's content"
    if result.tool_calls and truncated(generation, result):
        return "the completion was cut off by the token limit inside its tool calls"
    for call in result.tool_calls:
        problem = tool_call_problem(call, generation.tools)
        if problem is not None:
            return problem
    return None


def without_image_data(messages: list[dict[str, Any]], images: list[ImageInput]) -> list[dict[str, Any]]:
    """``messages`` with each image's data URL replaced by ``sha256:<hex>`` (the bytes are in the store).

    ``images`` are the messages' image parts decoded, in the same order (``request_images``).
    """
    if not images:
        return messages
    hashes = iter(image.sha256 for image in images)
    recorded = copy.deepcopy(messages)
    for message in recorded:
        content = message.get("content")
        for part in content if isinstance(content, list) else []:
            if part.get("type") == "image_url":
                part["image_url"] = {"url": f"sha256:{next(hashes)}"}
    return recorded


def call_record(
    generation: GenerationRequest,
    result: GenerationResult,
    *,
    index: int,
    adapter_version: int,
    started_at: float,
    finished_at: float,
    images: list[ImageRef] | None = None,
) -> CallRecord:
    """The record of one served call: the engine's exact ids and logprobs, the request's sampling
    settings, its messages clipped and with image data replaced by the images' hashes."""
    unparsed = unparsed_reason(generation, result)
    return CallRecord(
        index=index,
        prompt_token_ids=list(result.prompt_token_ids),
        completion_token_ids=list(result.completion_token_ids),
        completion_logprobs=list(result.completion_logprobs),
        logprobs_mode=result.logprobs_mode,
        adapter_version=adapter_version,
        finish_reason=result.finish_reason,
        started_at=started_at,
        finished_at=finished_at,
        temperature=generation.temperature,
        top_p=generation.top_p,
        messages=clipped_for_record(without_image_data(generation.messages, generation.images)),
        tools=generation.tools,
        images=images or [],
        unparsed_tool_call=unparsed is not None,
        unparsed_reason=unparsed,
        truncated=truncated(generation, result),
        answered=bool(result.content or result.tool_calls),
        answer=None
        if result.completion_token_ids
        else {"content": result.content, "tool_calls": result.tool_calls},
    )
