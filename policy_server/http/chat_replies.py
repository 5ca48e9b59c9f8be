"""The OpenAI chat-completions answers: a ``chat.completion`` object, or the ``chat.completion.chunk``
objects of a stream. Both carry vLLM's ``return_token_ids`` extension: ``prompt_token_ids`` at the top
level and ``token_ids`` on the choice.
"""

from __future__ import annotations

import json
import time
import uuid
from typing import Any

from policy_server.engines.base import GenerationResult


def _tool_calls(result: GenerationResult) -> list[dict[str, Any]]:
    calls = []
    for call in result.tool_calls:
        function = call.get("function", {})
        arguments = function.get("arguments", "{}")
        calls.append(
            {
                "id": call.get("id") or f"call_{uuid.uuid4().hex[:24]}",
                "type": "function",
                "function": {
                    "name": function.get("name", ""),
                    "arguments": arguments if isinstance(arguments, str) else json.dumps(arguments),
                },
            }
        )
    return calls


def _usage(result: GenerationResult) -> dict[str, int]:
    prompt, completion = len(result.prompt_token_ids), len(result.completion_token_ids)
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}


class CompletionIds:
    """The id, creation time and model name shared by a response or by every chunk of one stream."""

    def __init__(self, model: str) -> None:
        self.id = f"chatcmpl-{uuid.uuid4().hex}"
        self.created = int(time.time())
        self.model = model


def sampled_logprobs(result: GenerationResult) -> dict[str, Any]:
    """OpenAI's ``choice.logprobs`` for the sampled tokens, as the engine recorded them. Tokens are
    named ``token_id:<id>`` (vLLM's ``--return-tokens-as-token-ids`` form): the gateway has no
    tokenizer, and ids are what training uses."""
    return {
        "content": [
            {"token": f"token_id:{token}", "logprob": logprob, "bytes": None, "top_logprobs": []}
            for token, logprob in zip(result.completion_token_ids, result.completion_logprobs, strict=True)
        ]
    }


def completion_body(
    result: GenerationResult, ids: CompletionIds, *, logprobs: bool = False
) -> dict[str, Any]:
    """A ``chat.completion`` object; with ``logprobs``, the sampled tokens' logprobs."""
    message: dict[str, Any] = {"role": "assistant", "content": result.content}
    tool_calls = _tool_calls(result)
    if tool_calls:
        message["tool_calls"] = tool_calls
    if result.reasoning_content is not None:
        message["reasoning_content"] = result.reasoning_content
    return {
        "id": ids.id,
        "object": "chat.completion",
        "created": ids.created,
        "model": ids.model,
        "choices": [
            {
                "index": 0,
                "message": message,
                "logprobs": sampled_logprobs(result) if logprobs else None,
                "finish_reason": result.finish_reason,
                "token_ids": list(result.completion_token_ids),
            }
        ],
        "usage": _usage(result),
        "prompt_token_ids": list(result.prompt_token_ids),
    }


def stream_chunks(
    result: GenerationResult, ids: CompletionIds, *, include_usage: bool, logprobs: bool = False
) -> list[dict[str, Any]]:
    """The ``chat.completion.chunk`` objects that stream one finished generation.

    The engine has already produced the whole completion, so each kind of delta (reasoning, text,
    each tool call) goes out as one chunk; clients accumulate deltas the same way either way.
    """
    usage_field: dict[str, Any] = {"usage": None} if include_usage else {}

    def chunk(
        delta: dict[str, Any],
        finish_reason: str | None = None,
        *,
        choice_extra: dict[str, Any] | None = None,
        top_extra: dict[str, Any] | None = None,
    ) -> dict[str, Any]:
        choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish_reason}
        return {
            "id": ids.id,
            "object": "chat.completion.chunk",
            "created": ids.created,
            "model": ids.model,
            "choices": [{**choice, **(choice_extra or {})}],
            **usage_field,
            **(top_extra or {}),
        }

    chunks = [
        chunk(
            {"role": "assistant", "content": ""},
            top_extra={"prompt_token_ids": list(result.prompt_token_ids)},
        )
    ]
    if result.reasoning_content:
        chunks.append(chunk({"reasoning_content": result.reasoning_content}))
    if result.content:
        chunks.append(chunk({"content": result.content}))
    for index, call in enumerate(_tool_calls(result)):
        chunks.append(chunk({"tool_calls": [{"index": index, **call}]}))
    last: dict[str, Any] = {"token_ids": list(result.completion_token_ids)}
    if logprobs:
        last["logprobs"] = sampled_logprobs(result)
    chunks.append(chunk({}, result.finish_reason, choice_extra=last))
    if include_usage:
        chunks.append(
            {
                "id": ids.id,
                "object": "chat.completion.chunk",
                "created": ids.created,
                "model": ids.model,
                "choices": [],
                "usage": _usage(result),
            }
        )
    return chunks
