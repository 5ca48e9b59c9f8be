"""gpt-oss: the harmony format (channels analysis, commentary and final; tool calls addressed
``to=functions.NAME``), vLLM's ``openai`` tool-call and ``openai_gptoss`` reasoning parsers, a
``reasoning_effort`` switch, rftkit's chunked attention for training (its attention sinks and sliding
windows, exact, with no [T, T] scores); its tiny model
ships the ``harmony`` template (``policy_server/models/tiny_gpt_oss.py``).

Harmony is token-level: the channel and the recipient live in special tokens, so a completion is
decoded with them and split into messages here, to the fields vLLM's harmony parser returns
(``vllm/parser/harmony.py``): every analysis message joined by newlines as ``reasoning_content``,
final and recipient-less commentary messages joined as ``content``, each message to a function as a
tool call whose JSON arguments are re-serialised as vLLM does (``json.dumps(json.loads(...))``).
"""

from __future__ import annotations

import json
import re
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from policy_server.models.families.base import Family, ParsedCompletion, TinySizes

START = "<|start|>"
MESSAGE = "<|message|>"
# What ends a message: <|end|> in the middle of a completion, <|call|> or <|return|> at its end
# (the engine strips the last one before parsing; a completion cut by max_tokens has none).
_MESSAGE_ENDS = re.compile(r"<\|end\|>|<\|call\|>|<\|return\|>")
_CHANNEL = re.compile(r"<\|channel\|>\s*([^\s<]+)")
_RECIPIENT = re.compile(r"(?:^|\s)to=([^\s<]+)")
_CONSTRAIN = re.compile(r"<\|constrain\|>\s*(\S+)")
# Recipients of harmony's built-in tools, never function calls (vLLM's harmony_utils).
_BUILTIN_TOOLS = ("python", "browser", "container")


def _function_name(recipient: str | None) -> str | None:
    """The function a recipient names, or None when the message goes to no function."""
    if not recipient or recipient.startswith("<|") or recipient == "assistant":
        return None
    if recipient.startswith("functions."):
        return recipient.removeprefix("functions.") or None
    return None if recipient.split(".", 1)[0] in _BUILTIN_TOOLS else recipient


def _arguments(body: str, content_type: str | None) -> str:
    if content_type is not None and "json" not in content_type:
        return body
    try:
        return json.dumps(json.loads(body))
    except json.JSONDecodeError:
        return body


def _content_type(header: str) -> str | None:
    """The header's content type: ``<|constrain|>json``'s, or a bare word after channel and recipient."""
    constrained = _CONSTRAIN.search(header)
    if constrained:
        return constrained.group(1)
    rest = _RECIPIENT.sub(" ", _CHANNEL.sub(" ", header)).split()
    return rest[-1] if rest else None


def parse_harmony(text: str, *, tools: bool = True) -> ParsedCompletion:
    """Split harmony text that continues a prompt ending ``<|start|>assistant`` into vLLM's fields.

    Without ``tools`` the calls are dropped, as vLLM's chat endpoint drops them for a request that
    offers no tools (or sets ``tool_choice: none``).
    """
    reasoning: list[str] = []
    content: list[str] = []
    tool_calls: list[dict[str, Any]] = []
    for index, message in enumerate(text.split(START)):
        if not message and index == 0:
            continue
        header, found, body = message.partition(MESSAGE)
        if not found:
            # A message cut inside its header: vLLM hands back its raw text as the answer.
            content.append(message if index == 0 else START + message)
            continue
        if index > 0:
            role = re.split(r"\s|<\|", header, maxsplit=1)[0]
            if role != "assistant":
                continue
            header = header[len(role) :]
        body = _MESSAGE_ENDS.split(body, maxsplit=1)[0]
        channel_match, recipient_match = _CHANNEL.search(header), _RECIPIENT.search(header)
        channel = channel_match.group(1) if channel_match else None
        recipient = recipient_match.group(1) if recipient_match else None
        name = _function_name(recipient)
        if name is not None:
            arguments = _arguments(body, _content_type(header))
            tool_calls.append(
                {
                    "id": f"call_{uuid.uuid4().hex[:24]}",
                    "type": "function",
                    "function": {"name": name, "arguments": arguments},
                }
            )
        elif channel == "analysis" and body:
            reasoning.append(body)
        elif (channel == "final" or (channel == "commentary" and recipient is None)) and body:
            content.append(body)
    return ParsedCompletion(
        content="\n".join(content) or None,
        tool_calls=tool_calls if tools else [],
        reasoning_content="\n".join(reasoning) or None,
    )


class GptOss(Family):
    name = "gpt_oss"
    model_types = ("gpt_oss",)
    vllm_tool_call_parser = "openai"
    vllm_reasoning_parser = "openai_gptoss"
    reasoning_efforts = ("low", "medium", "high")
    vllm_harmony = True
    # vLLM's and harmony's default; the token floors' sources: docs/models.md, gpt_oss.
    default_reasoning_effort = "medium"
    reasoning_tokens = (("low", 1024), ("medium", 4096), ("high", 16384))
    # Attention sinks: transformers' gpt-oss implements them in eager, flash and flex attention, not
    # SDPA (``_supports_sdpa = False``). Eager keeps [rows, heads, T, T] scores per layer; rftkit's
    # chunked attention (policy_server/models/chunked_attention.py) computes the same numbers a block
    # of queries at a time, on every device.
    train_attn_implementation = "rftkit_chunked"

    def parse(self, tokenizer: Any, completion_ids: Sequence[int], *, tools: bool) -> ParsedCompletion:
        """vLLM's harmony parse of these tokens, decoded with their special tokens."""
        return parse_harmony(tokenizer.decode(list(completion_ids), skip_special_tokens=False), tools=tools)

    def parse_text(self, text: str, *, tools: bool) -> ParsedCompletion:
        """:meth:`parse` for text cut at a stop string (decoded without the special tokens, so it
        carries no channel: the text is the answer)."""
        return parse_harmony(text, tools=tools)

    def build_tiny(
        self, out: Path, *, seed: int = 0, corpus: Sequence[str] = (), sizes: TinySizes = TinySizes()
    ) -> Path:
        from policy_server.models.tiny_gpt_oss import build_tiny_gpt_oss

        return build_tiny_gpt_oss(out, seed=seed, corpus=list(corpus), sizes=sizes)


FAMILY = GptOss()
