"""Gemma 4 (google/gemma-4-*): ``<|turn>``/``<turn|>`` turns, tools declared, called and answered in
``<|tool>``, ``<|tool_call>`` and ``<|tool_response>`` blocks whose strings are wrapped in the
``<|"|>`` token, reasoning in a ``<|channel>thought`` channel; vLLM's ``gemma4`` tool-call and
reasoning parsers. Thinking is an on/off switch, ``chat_template_kwargs: {"enable_thinking": true}``
(no ``reasoning_effort``). Its tiny model ships the ``gemma4`` template.
"""

from __future__ import annotations

import json
import re
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from policy_server.models.families.base import Family, ParsedCompletion, TinySizes

TURN_START = "<|turn>"
TURN_END = "<turn|>"
CHANNEL_START = "<|channel>"
CHANNEL_END = "<channel|>"
TOOL_CALL_START = "<|tool_call>"
TOOL_CALL_END = "<tool_call|>"
QUOTE = '<|"|>'
THOUGHT_LABEL = "thought\n"
_CALL = re.compile(r"call:(\w*)[{(](.*)", re.DOTALL)


class Gemma4(Family):
    name = "gemma4"
    model_types = ("gemma4", "gemma4_text")
    vllm_tool_call_parser = "gemma4"
    vllm_reasoning_parser = "gemma4"

    def parse(self, tokenizer: Any, completion_ids: Sequence[int], *, tools: bool) -> ParsedCompletion:
        """vLLM's gemma4 parsers read text decoded with the special tokens kept (``<|"|>`` too)."""
        return self.parse_text(tokenizer.decode(list(completion_ids), skip_special_tokens=False), tools=tools)

    def parse_text(self, text: str, *, tools: bool) -> ParsedCompletion:
        """Reasoning out of the thought channel; tool calls out of ``<|tool_call>`` blocks.

        Calls are taken out of the content whether or not the request offered tools, as vLLM's
        parser does; they are returned only when it did. A bare value (``count:42``) is typed as
        the JSON literal it spells, where vLLM types it by the tool's schema: the two agree whenever
        a value has its schema's type.
        """
        reasoning, rest = _split_reasoning(text)
        content_parts: list[str] = []
        calls: list[dict[str, Any]] = []
        while TOOL_CALL_START in rest:
            before, _, after = rest.partition(TOOL_CALL_START)
            content_parts.append(before)
            body, _, rest = after.partition(TOOL_CALL_END)
            call = _tool_call(body)
            if call is not None:
                calls.append(call)
        content_parts.append(rest)
        content = "".join(content_parts).replace(CHANNEL_END, "")
        if calls:
            content = content.strip()
        return ParsedCompletion(
            content=content or None, tool_calls=calls if tools else [], reasoning_content=reasoning
        )

    def reasoning_effort_refusal(self, effort: Any) -> str | None:
        return (
            "Gemma 4 has no reasoning_effort; leave it unset and switch thinking on with "
            'chat_template_kwargs {"enable_thinking": true}.'
        )

    def build_tiny(
        self, out: Path, *, seed: int = 0, corpus: Sequence[str] = (), sizes: TinySizes = TinySizes()
    ) -> Path:
        from policy_server.models.families.gemma4_tiny import build_tiny_gemma4

        return build_tiny_gemma4(out, seed=seed, corpus=corpus, sizes=sizes)


def _split_reasoning(text: str) -> tuple[str | None, str]:
    """(reasoning, the rest). A completion that starts inside the channel (its opener in the prompt,
    or dropped) counts as reasoning up to ``<channel|>``, as vLLM's parser reads it."""
    if CHANNEL_START not in text and (
        CHANNEL_END in text or text.startswith(THOUGHT_LABEL) or text == "thought"
    ):
        text = CHANNEL_START + text
    before, found, after = text.partition(CHANNEL_START)
    if not found:
        return None, text
    end = _first(after, (CHANNEL_END, TOOL_CALL_START))
    reasoning, rest = after[:end], after[end:]
    if rest.startswith(CHANNEL_END):
        rest = rest[len(CHANNEL_END) :]
    reasoning = reasoning.rstrip()
    if reasoning.startswith(THOUGHT_LABEL):
        reasoning = reasoning[len(THOUGHT_LABEL) :]
    elif reasoning == THOUGHT_LABEL.rstrip():
        reasoning = ""
    return reasoning or None, before + rest


def _first(text: str, markers: tuple[str, ...]) -> int:
    found = [index for marker in markers if (index := text.find(marker)) >= 0]
    return min(found) if found else len(text)


def _tool_call(body: str) -> dict[str, Any] | None:
    match = _CALL.match(body.strip()) or re.match(r":(\w*)[{(](.*)", body.strip(), re.DOTALL)
    if match is None or not match.group(1):
        return None
    name, raw = match.group(1), match.group(2).strip()
    if raw.endswith("}") or raw.endswith(")"):
        raw = raw[:-1]
    arguments = json.dumps(_typed(parse_arguments(raw)), ensure_ascii=False)
    return {
        "id": f"call_{uuid.uuid4().hex[:24]}",
        "type": "function",
        "function": {"name": name, "arguments": arguments},
    }


def _typed(value: Any) -> Any:
    if isinstance(value, dict):
        return {key: _typed(inner) for key, inner in value.items()}
    if isinstance(value, list):
        return [_typed(inner) for inner in value]
    if isinstance(value, _Bare):
        try:
            return json.loads(value)
        except ValueError:
            return str(value)
    return value


class _Bare(str):
    """A value written without ``<|"|>`` quotes: a number, true/false/null, or a stray word."""


def parse_arguments(text: str) -> dict[str, Any]:
    """Gemma's ``key:value,...`` argument text as a dict (strings unquoted, bare values as _Bare)."""
    reader = _Reader(text)
    return reader.mapping(closing="")


class _Reader:
    """A recursive reader over Gemma's argument syntax; it never raises, keeping what it could read."""

    def __init__(self, text: str) -> None:
        self.text, self.at = text, 0

    def skip(self, characters: str) -> None:
        while self.at < len(self.text) and self.text[self.at] in characters:
            self.at += 1

    def mapping(self, closing: str) -> dict[str, Any]:
        result: dict[str, Any] = {}
        while True:
            self.skip(" ,\n\t")
            if self.at >= len(self.text) or (closing and self.text.startswith(closing, self.at)):
                self.at += len(closing)
                return result
            colon = self.text.find(":", self.at)
            if colon < 0:
                self.at = len(self.text)
                return result
            key = self.text[self.at : colon].strip()
            if key.startswith(QUOTE) and key.endswith(QUOTE) and len(key) >= 2 * len(QUOTE):
                key = key[len(QUOTE) : -len(QUOTE)]
            self.at = colon + 1
            self.skip(" \n\t")
            result[key] = self.value(stops=",}]")

    def sequence(self) -> list[Any]:
        items: list[Any] = []
        while True:
            self.skip(" ,\n\t")
            if self.at >= len(self.text) or self.text.startswith("]", self.at):
                self.at += 1
                return items
            items.append(self.value(stops=",]"))

    def value(self, stops: str) -> Any:
        if self.text.startswith(QUOTE, self.at):
            start = self.at + len(QUOTE)
            end = self.text.find(QUOTE, start)
            end = len(self.text) if end < 0 else end
            self.at = end + len(QUOTE)
            return self.text[start:end]
        if self.text.startswith("{", self.at):
            self.at += 1
            return self.mapping(closing="}")
        if self.text.startswith("[", self.at):
            self.at += 1
            return self.sequence()
        start = self.at
        while self.at < len(self.text) and self.text[self.at] not in stops:
            self.at += 1
        return _Bare(self.text[start : self.at].strip())


FAMILY = Gemma4()
