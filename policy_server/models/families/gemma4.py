"""Gemma 4 (google/gemma-4-*): ``<|turn>``/``<turn|>`` turns, tools declared, called and answered in
``<|tool>``, ``<|tool_call>`` and ``<|tool_response>`` blocks whose strings are wrapped in the
``<|"|>`` token, reasoning in a ``<|channel>thought`` channel; vLLM's ``gemma4`` tool-call and
reasoning parsers. Thinking is an on/off switch, ``chat_template_kwargs: {"enable_thinking": true}``
(no ``reasoning_effort``). Its tiny model ships the ``gemma4`` template.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from policy_server.models.families.argument_types import tool_properties, typed_arguments
from policy_server.models.families.base import Family, ParsedCompletion, TinySizes

TURN_START = "<|turn>"
TURN_END = "<turn|>"
CHANNEL_START = "<|channel>"
CHANNEL_END = "<channel|>"
TOOL_CALL_START = "<|tool_call>"
TOOL_CALL_END = "<tool_call|>"
QUOTE = '<|"|>'
THOUGHT_LABEL = "thought\n"


class Gemma4(Family):
    name = "gemma4"
    model_types = ("gemma4", "gemma4_text")
    vllm_tool_call_parser = "gemma4"
    vllm_reasoning_parser = "gemma4"
    # vLLM 0.32 applies a LoRA on k_proj of the global layers, whose values reuse their keys, other
    # than transformers does (0.73 apart on a random adapter), and its Gemma 4 loads no LoRA on the
    # embeddings or the output head (docs/models.md, gemma4).
    vllm_mismatched_lora_modules = ("k_proj",)
    vllm_unloadable_lora_modules = ("embed_tokens", "lm_head")
    # No train_attn_implementation: Gemma 4's text layers (sliding windows, no sinks, no soft-capping)
    # train in transformers' default, SDPA, whose fused kernels keep no [T, T] scores on CUDA.

    def __init__(self, properties: Mapping[str, Mapping[str, Any]] | None = None) -> None:
        # Each offered tool's parameter properties, which type the call's values (with_tools).
        self._properties = dict(properties or {})

    def with_tools(self, tools: Sequence[Mapping[str, Any]] | None) -> Family:
        return Gemma4(tool_properties(tools)) if tools else self

    def parse(self, tokenizer: Any, completion_ids: Sequence[int], *, tools: bool) -> ParsedCompletion:
        """vLLM's gemma4 parsers read text decoded with the special tokens kept (``<|"|>`` too)."""
        return self.parse_text(tokenizer.decode(list(completion_ids), skip_special_tokens=False), tools=tools)

    def parse_text(self, text: str, *, tools: bool) -> ParsedCompletion:
        """Reasoning out of the thought channel; tool calls out of ``<|tool_call>`` blocks.

        Calls are taken out of the content whether or not the request offered tools, as vLLM's
        parser does; they are returned only when it did. Their values are typed by the offered
        tools' schemas (:meth:`with_tools`), strings where no schema says otherwise.
        """
        reasoning, rest = _split_reasoning(text)
        content_parts: list[str] = []
        calls: list[dict[str, Any]] = []
        while TOOL_CALL_START in rest:
            before, _, after = rest.partition(TOOL_CALL_START)
            content_parts.append(before)
            body, _, rest = after.partition(TOOL_CALL_END)
            call = _tool_call(body, self._properties)
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


def _tool_call(body: str, properties: Mapping[str, Mapping[str, Any]]) -> dict[str, Any] | None:
    """The call a ``<|tool_call>`` block holds: ``call:NAME{ARGS}`` (or ``:NAME{...}``); None without
    a name. Every value is read as a string, then typed by the tool's schema, as vLLM types it."""
    prefix, colon = body.find("call:"), body.find(":")
    if colon < 0:
        return None
    start = prefix + len("call:") if 0 <= prefix and prefix + len("call") == colon else colon + 1
    brace = _first(body[start:], ("{", "("))
    name, raw = body[start : start + brace].strip(), body[start + brace + 1 :].strip()
    if not name:
        return None
    if raw.endswith("}") or (raw.endswith(")") and raw.count("(") < raw.count(")")):
        raw = raw[:-1]
    arguments = parse_arguments(raw)
    if name in properties:
        arguments = typed_arguments(arguments, properties[name])
    return {
        "id": f"call_{uuid.uuid4().hex[:24]}",
        "type": "function",
        "function": {"name": name, "arguments": json.dumps(arguments, ensure_ascii=False)},
    }


def parse_arguments(text: str) -> dict[str, Any]:
    """Gemma's ``key:value,...`` argument text as a dict: strings unquoted, every leaf a string."""
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
        return self.text[start : self.at].strip()


FAMILY = Gemma4()
