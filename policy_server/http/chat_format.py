"""Hermes-style tool calls: parsing ``<tool_call>`` blocks out of completions, normalising requests.

A completion such as ``I'll look.\\n<tool_call>\\n{"name": "f", "arguments": {"x": 1}}\\n</tool_call>``
becomes content ``"I'll look."`` and one OpenAI tool call whose ``arguments`` is the JSON string
``json.dumps(arguments, ensure_ascii=False)``: exactly what the chat template renders back, so the
next turn's prompt extends this one token for token.
"""

from __future__ import annotations

import copy
import json
import re
import uuid
from typing import Any

TOOL_CALL_PATTERN = re.compile(r"<tool_call>(.*?)</tool_call>", re.DOTALL)


def _tool_call_from_block(block: str) -> dict[str, Any] | None:
    """The OpenAI tool call a ``<tool_call>`` block encodes, or None when it is not a valid call."""
    try:
        payload = json.loads(block)
    except json.JSONDecodeError:
        return None
    if not isinstance(payload, dict) or not isinstance(payload.get("name"), str) or not payload["name"]:
        return None
    arguments = payload.get("arguments", {})
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments)
        except json.JSONDecodeError:
            return None
    if not isinstance(arguments, dict):
        return None
    return {
        "id": f"call_{uuid.uuid4().hex[:24]}",
        "type": "function",
        "function": {"name": payload["name"], "arguments": json.dumps(arguments, ensure_ascii=False)},
    }


def parse_tool_calls(text: str) -> tuple[str | None, list[dict[str, Any]]]:
    """Split a completion into (content, tool_calls).

    Valid blocks become tool calls; a block whose JSON is malformed (or that lacks a name) stays in
    the content verbatim, as does an unclosed ``<tool_call>``. Without tool calls the content is the
    text unchanged; with them it is the rest of the text, stripped. Empty content is None.
    """
    tool_calls: list[dict[str, Any]] = []
    kept: list[str] = []
    position = 0
    for match in TOOL_CALL_PATTERN.finditer(text):
        call = _tool_call_from_block(match.group(1))
        if call is None:
            continue
        kept.append(text[position : match.start()])
        tool_calls.append(call)
        position = match.end()
    if not tool_calls:
        # Untouched, so that the text renders back to the very tokens that were sampled.
        return (text or None), []
    kept.append(text[position:])
    content = "".join(kept).strip()
    return (content or None), tool_calls


def content_text(content: Any) -> str | None:
    """Plain text of a message's content: a string, or its text parts joined by newlines, as vLLM does."""
    if content is None or isinstance(content, str):
        return content
    if isinstance(content, list):
        return "\n".join(
            part.get("text", "") for part in content if isinstance(part, dict) and part.get("type") == "text"
        )
    raise ValueError(
        f"message content must be a string or a list of content parts, not {type(content).__name__}"
    )


def normalize_messages(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Copies of ``messages`` ready for the chat template.

    Text-part lists become strings, and tool-call ``arguments`` sent as JSON strings become objects,
    so the template renders them canonically (``tojson``) whatever spacing the client used. Arguments
    that are not a JSON object stay strings and render verbatim. The input is not modified.
    """
    normalized: list[dict[str, Any]] = []
    for message in messages:
        message = copy.deepcopy(message)
        if isinstance(message.get("content"), list) and all(
            isinstance(part, dict) and part.get("type") == "text" for part in message["content"]
        ):
            message["content"] = content_text(message["content"])
        for tool_call in message.get("tool_calls") or []:
            function = tool_call.get("function", tool_call) if isinstance(tool_call, dict) else None
            if not isinstance(function, dict) or not isinstance(function.get("arguments"), str):
                continue
            try:
                arguments = json.loads(function["arguments"])
            except json.JSONDecodeError:
                continue
            if isinstance(arguments, dict):
                function["arguments"] = arguments
        normalized.append(message)
    return normalized
