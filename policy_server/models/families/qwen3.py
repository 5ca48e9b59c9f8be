"""Qwen3 (0.6B to 235B, dense ``qwen3`` and MoE ``qwen3_moe``; Instruct-2507 and Thinking-2507 too):
ChatML with hermes ``<tool_call>`` JSON blocks under Qwen's tools preamble and ``<think>`` reasoning
at the start of assistant turns (the ``qwen3`` template, which the tiny model ships); vLLM's
``hermes`` tool-call parser and ``qwen3`` reasoning parser.

The hf engine splits a completion as those two parsers of vLLM 0.32 do, field for field
(``tests/policy_server/test_qwen3_family.py`` feeds both the same texts): with thinking on (the
default), everything before ``</think>`` is reasoning, a ``<think>`` opener dropped, and a reply
that never closes its think block is all reasoning; a ``<tool_call>`` ends the reasoning too. The
hermes parser then takes ``<tool_call>`` blocks out of the rest: the content is the text before the
first block (None when only whitespace), and one malformed block leaves every call in the content.
A request with ``chat_template_kwargs: {enable_thinking: false}`` has no reasoning to split.
"""

from __future__ import annotations

import json
import re
import uuid
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from policy_server.models.families.base import Family, ParsedCompletion, TinySizes

THINK_START, THINK_END = "<think>", "</think>"
TOOL_CALL_START = "<tool_call>"
# vLLM's hermes parser: closed blocks, or an unclosed one running to the end of the text.
_TOOL_CALL = re.compile(r"<tool_call>(.*?)</tool_call>|<tool_call>(.*)", re.DOTALL)


def split_reasoning(text: str) -> tuple[str | None, str | None]:
    """(reasoning, content) as vLLM's ``qwen3`` reasoning parser splits a thinking completion."""
    end = text.find(THINK_END)
    call = text.find(TOOL_CALL_START)
    if end < 0 or 0 <= call < end:
        # No </think> before a tool call: reasoning runs to the call, or to the end of the text.
        stop = call if call >= 0 else len(text)
        reasoning, content = text[:stop], text[stop:]
    else:
        reasoning, content = text[:end], text[end + len(THINK_END) :]
    # vLLM drops the tags themselves: an opener inside the reasoning, a second closer in the content.
    reasoning = reasoning.replace(THINK_START, "")
    content = content.replace(THINK_END, "")
    return (reasoning or None), (content or None)


def hermes_tool_calls(content: str | None) -> tuple[str | None, list[dict[str, Any]]]:
    """(content, tool calls) as vLLM's ``hermes`` parser reads an auto-tool-choice reply."""
    if content is None or TOOL_CALL_START not in content:
        return content, []
    calls: list[dict[str, Any]] = []
    for closed, unclosed in _TOOL_CALL.findall(content):
        try:
            payload = json.loads(closed or unclosed)
            name, arguments = payload["name"], payload["arguments"]
        except (ValueError, TypeError, KeyError):
            return content, []  # vLLM gives up on the whole reply: no call, the text as content
        calls.append(
            {
                "id": f"call_{uuid.uuid4().hex[:24]}",
                "type": "function",
                "function": {"name": name, "arguments": json.dumps(arguments, ensure_ascii=False)},
            }
        )
    before = content[: content.find(TOOL_CALL_START)]
    return (before if before.strip() else None), calls


class Qwen3(Family):
    name = "qwen3"
    model_types = ("qwen3", "qwen3_moe")
    vllm_tool_call_parser = "hermes"
    vllm_reasoning_parser = "qwen3"
    # enable_thinking (chat_template_kwargs) is the switch; Qwen3's template reads no reasoning_effort.
    thinking = True

    def parsing_for(self, chat_template_kwargs: Mapping[str, Any]) -> Family:
        """vLLM's qwen3 parser splits no reasoning off a request that turned thinking off."""
        return _NOT_THINKING if chat_template_kwargs.get("enable_thinking", True) is False else self

    def reasoning_effort_refusal(self, effort: Any) -> str | None:
        return (
            "Qwen3 has no reasoning_effort; leave it unset: it thinks unless a call sends "
            'chat_template_kwargs {"enable_thinking": false}.'
        )

    def parse(self, tokenizer: Any, completion_ids: Sequence[int], *, tools: bool) -> ParsedCompletion:
        """vLLM decodes for these parsers with the special tokens kept."""
        return self.parse_text(tokenizer.decode(list(completion_ids), skip_special_tokens=False), tools=tools)

    def parse_text(self, text: str, *, tools: bool) -> ParsedCompletion:
        reasoning, content = split_reasoning(text) if self.thinking else (None, text or None)
        tool_calls: list[dict[str, Any]] = []
        if tools:
            content, tool_calls = hermes_tool_calls(content)
        return ParsedCompletion(content=content, tool_calls=tool_calls, reasoning_content=reasoning)

    def build_tiny(
        self, out: Path, *, seed: int = 0, corpus: Sequence[str] = (), sizes: TinySizes = TinySizes()
    ) -> Path:
        from policy_server.models.tiny_qwen3 import build_tiny_qwen3

        return build_tiny_qwen3(
            out,
            seed=seed,
            corpus=list(corpus),
            **sizes.builder_kwargs(),
        )


class _Qwen3NotThinking(Qwen3):
    thinking = False


FAMILY = Qwen3()
_NOT_THINKING = _Qwen3NotThinking()
