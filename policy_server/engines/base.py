"""The one interface every inference engine implements (hf in-process, vLLM out of process)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol

from policy_server.http.images import ImageInput
from policy_server.trace import LogprobsMode


@dataclass
class GenerationRequest:
    """One chat call, normalised by the gateway (OpenAI message dicts, plain-string content).

    Images: a message with an image keeps its content as the list of OpenAI parts, in order (text
    parts ``{"type": "text", "text": ...}`` and image parts ``{"type": "image_url", "image_url":
    {"url": "data:image/...;base64,..."}}``, the data URL exactly as the agent sent it), in user
    messages and tool results alike. ``images`` holds those images decoded and validated by the
    gateway (``policy_server/http/images.py``), in the order their parts appear across ``messages``: the
    order of their placeholders in the rendered prompt. An engine feeds the model these (the hf
    engine their pixels, the vLLM engine the messages' data URLs) and never refetches or re-validates
    them. Engines that take images set ``supports_images = True`` and ``image_token_id`` (the
    placeholder token the prompt ids carry, one run per image); the gateway refuses images for others.
    """

    messages: list[dict[str, Any]]
    max_tokens: int
    temperature: float = 1.0
    top_p: float = 1.0
    tools: list[dict[str, Any]] | None = None
    tool_choice: Any = None
    stop: list[str] | None = None
    seed: int | None = None
    adapter_version: int = 0
    reasoning_effort: str | None = None
    chat_template_kwargs: dict[str, Any] = field(default_factory=dict)
    images: list[ImageInput] = field(default_factory=list)
    # The rollout this call belongs to: an engine with several replicas keeps a rollout's calls on
    # one replica, whose prefix cache then holds the conversation so far.
    rollout_id: str | None = None


@dataclass
class GenerationResult:
    """What the engine sampled, token for token, plus the parsed assistant message."""

    prompt_token_ids: list[int]
    completion_token_ids: list[int]
    completion_logprobs: list[float]
    logprobs_mode: LogprobsMode
    finish_reason: str
    content: str | None
    tool_calls: list[dict[str, Any]] = field(default_factory=list)
    reasoning_content: str | None = None
    # Whether max_tokens cut the completion off, where the engine knows: finish_reason says
    # "tool_calls" (as vLLM's does) when calls were parsed out of a cut completion. None: unknown.
    truncated: bool | None = None


@dataclass(frozen=True)
class EngineOccupancy:
    """How full an engine's batch is now (engines that can tell expose ``occupancy()``).

    ``forward_passes`` and ``batch_rows`` (rows summed over passes) are running totals, so their rates'
    ratio is the mean batch occupancy over any window; None where the engine does not count them.
    """

    running: int
    waiting: int
    capacity: int | None = None
    forward_passes: int | None = None
    batch_rows: int | None = None


class Engine(Protocol):
    """An inference engine behind the gateway.

    Adapter versions are integers chosen by the policy server (0 = base model, no adapter); the
    engine maps each to its own storage (a peft adapter name, a vLLM LoRA name) so that a version
    number is never reused for different weights.
    """

    model_name: str

    async def start(self) -> None: ...

    async def close(self) -> None: ...

    async def generate(self, request: GenerationRequest) -> GenerationResult: ...

    async def load_adapter(self, version: int, path: str) -> None: ...

    async def unload_adapter(self, version: int) -> None: ...


# The message fields every chat template renders; others (``reasoning_content``, say) many drop.
RENDERED_FIELDS = ("content", "tool_calls")


def text_chars(value: Any) -> int:
    """Characters of text in a value: every string, keys and values, at any depth."""
    if isinstance(value, str):
        return len(value)
    if isinstance(value, dict):
        return sum(len(key) + text_chars(item) for key, item in value.items())
    if isinstance(value, list | tuple):
        return sum(text_chars(item) for item in value)
    return 0


def prompt_too_long(request: GenerationRequest, context_tokens: int, longest_token_chars: int) -> str | None:
    """Why the request cannot fit the context, judged from its text alone (before tokenising it), or None.

    No token covers more than ``longest_token_chars`` characters, so text of more than
    ``context_tokens * longest_token_chars`` characters is more tokens than the context holds. Counted:
    the messages' content and tool calls and the tools, which every template renders; images are left
    out (their placeholders only add to the count), and so are fields a template may drop.
    """
    rendered = [message.get(key) for message in request.messages for key in RENDERED_FIELDS]
    chars = text_chars(rendered) + text_chars(request.tools or [])
    if chars <= context_tokens * longest_token_chars:
        return None
    return (
        f"the prompt has {chars} characters of text, more than the model's {context_tokens}-token "
        f"context can hold (no token covers more than {longest_token_chars} characters)"
    )
