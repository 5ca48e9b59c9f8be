"""The OpenAI chat-completions wire format: request validation, normalisation, responses and SSE chunks.

Requests are validated strictly (wrong types are refused, not coerced) and normalised to what chat
templates expect: text parts joined into one string, a missing assistant ``content`` made ``""``.
Responses carry vLLM's ``return_token_ids`` extension: ``prompt_token_ids`` at the top level and
``token_ids`` on the choice.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from policy_server.engines.base import GenerationRequest
from policy_server.errors import Rejection

# What a client may pass to the chat template: switches the templates in use read, as plain values.
# Never a template (`chat_template`: a client's Jinja runs on the server) and never the tokenizer's
# own arguments (`tokenize`, `return_tensors`, ...), which change what rendering returns.
ALLOWED_TEMPLATE_KWARGS = frozenset({"enable_thinking", "thinking", "reasoning_effort"})
MAX_TEMPLATE_VALUE_CHARS = 64
# Stop strings are checked against the decoded text at every sampled token: bound their work.
MAX_STOP_STRINGS = 16
MAX_STOP_CHARS = 256


class _Strict(BaseModel):
    # Unknown fields are ignored, as OpenAI-compatible servers do; known ones must have the right type.
    model_config = ConfigDict(strict=True, extra="ignore")


class TextPart(_Strict):
    type: Literal["text"]
    text: str


class ImageUrl(_Strict):
    url: str = Field(min_length=1)
    detail: str | None = None


class ImagePart(_Strict):
    type: Literal["image_url"]
    image_url: ImageUrl


class FunctionCall(_Strict):
    name: str = Field(min_length=1)
    arguments: str


class ToolCall(_Strict):
    id: str = Field(min_length=1)
    type: Literal["function"] = "function"
    function: FunctionCall


class Message(_Strict):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[Annotated[TextPart | ImagePart, Field(discriminator="type")]] | None = None
    name: str | None = Field(default=None, max_length=64)
    tool_calls: list[ToolCall] | None = None
    tool_call_id: str | None = None
    reasoning_content: str | None = None


class FunctionSpec(_Strict):
    name: str = Field(min_length=1)
    description: str | None = None
    parameters: dict[str, Any] | None = None
    # Accepted, not enforced: no guided decoding holds a call to its schema (docs/chat-api.md); the
    # OpenAI Agents SDK sends it on every tool.
    strict: bool | None = None


class Tool(_Strict):
    type: Literal["function"]
    function: FunctionSpec


class NamedFunction(_Strict):
    name: str = Field(min_length=1)


class NamedToolChoice(_Strict):
    type: Literal["function"]
    function: NamedFunction


class StreamOptions(_Strict):
    include_usage: bool = False


class ChatCompletionRequest(_Strict):
    """Every field of OpenAI's ``POST /v1/chat/completions``: each is honoured, accepted without effect
    (documented), or refused with a 400 naming it (:func:`refusal`); docs/chat-api.md has the table."""

    model: str
    messages: list[Message] = Field(min_length=1)
    max_tokens: int | None = Field(default=None, ge=1)
    max_completion_tokens: int | None = Field(default=None, ge=1)
    temperature: float = Field(default=1.0, ge=0.0, le=2.0)
    top_p: float = Field(default=1.0, gt=0.0, le=1.0)
    stop: str | list[str] | None = None
    seed: int | None = None
    n: int = Field(default=1, ge=1)
    stream: bool = False
    stream_options: StreamOptions | None = None
    tools: list[Tool] | None = None
    tool_choice: Literal["none", "auto", "required"] | NamedToolChoice | None = None
    reasoning_effort: str | None = Field(default=None, max_length=MAX_TEMPLATE_VALUE_CHARS)
    chat_template_kwargs: dict[str, Any] | None = None
    logprobs: bool = False
    top_logprobs: int | None = Field(default=None, ge=0, le=20)
    # Fields that would change what is sampled in ways the learner cannot reproduce, or ask for what
    # the policy cannot give: refused when set (refusal()).
    response_format: dict[str, Any] | None = None
    logit_bias: dict[str, float] | None = None
    frequency_penalty: float = 0.0
    presence_penalty: float = 0.0
    modalities: list[str] | None = None
    audio: dict[str, Any] | None = None
    prediction: dict[str, Any] | None = None
    web_search_options: dict[str, Any] | None = None
    # Accepted without effect on a self-hosted policy (OpenAI's storage, billing and batching).
    user: str | None = Field(default=None, max_length=256)
    store: bool | None = None
    metadata: dict[str, str] | None = None
    service_tier: str | None = Field(default=None, max_length=64)
    parallel_tool_calls: bool | None = None

    @field_validator("stop")
    @classmethod
    def _bounded_stop(cls, stop: str | list[str] | None) -> str | list[str] | None:
        strings = [stop] if isinstance(stop, str) else stop or []
        if len(strings) > MAX_STOP_STRINGS:
            raise ValueError(f"at most {MAX_STOP_STRINGS} stop strings are accepted, got {len(strings)}")
        if any(len(string) > MAX_STOP_CHARS for string in strings):
            raise ValueError(f"a stop string may be at most {MAX_STOP_CHARS} characters long")
        return stop

    @field_validator("chat_template_kwargs")
    @classmethod
    def _allowed_template_kwargs(cls, kwargs: dict[str, Any] | None) -> dict[str, Any] | None:
        for key, value in (kwargs or {}).items():
            if key not in ALLOWED_TEMPLATE_KWARGS:
                allowed = ", ".join(sorted(ALLOWED_TEMPLATE_KWARGS))
                raise ValueError(f"{key!r} is not accepted here; the chat template takes only {allowed}")
            if not (value is None or isinstance(value, bool | int | float | str)):
                raise ValueError(f"{key!r} must be a plain value (true/false, a number or a string)")
            if isinstance(value, str) and len(value) > MAX_TEMPLATE_VALUE_CHARS:
                raise ValueError(f"{key!r} may be at most {MAX_TEMPLATE_VALUE_CHARS} characters long")
        return kwargs


def parse_request(body: bytes) -> ChatCompletionRequest:
    """Validate a request body, turning every problem into a 400 with a sentence."""
    try:
        request = ChatCompletionRequest.model_validate_json(body)
    except ValidationError as error:
        raise Rejection(400, describe_validation_error(error)) from None
    problem = refusal(request)
    if problem is not None:
        raise Rejection(400, problem)
    return request


# Why constrained or penalised sampling is refused: the trainer recomputes each sampled token's
# probability from the policy alone, so a distribution changed by a grammar or a penalty would make
# every recorded logprob disagree with the learner's.
_NOT_THE_POLICY = (
    "it changes what is sampled away from the policy's own distribution, which the trainer learns from"
)


def refusal(request: ChatCompletionRequest) -> str | None:
    """The sentence refusing a field this server cannot honour, or None."""
    format_type = (request.response_format or {}).get("type", "text")
    checks = [
        (request.n != 1, "n", "rftkit samples one choice per call; make n calls instead"),
        (
            format_type != "text",
            f"response_format {format_type!r}",
            f"constrained decoding is not offered because {_NOT_THE_POLICY}; ask for JSON in the prompt "
            "and parse it in the agent",
        ),
        (bool(request.logit_bias), "logit_bias", f"it is refused because {_NOT_THE_POLICY}"),
        (request.frequency_penalty != 0, "frequency_penalty", f"it is refused because {_NOT_THE_POLICY}"),
        (request.presence_penalty != 0, "presence_penalty", f"it is refused because {_NOT_THE_POLICY}"),
        (
            bool(request.top_logprobs),
            "top_logprobs",
            "only the sampled tokens' logprobs are returned (logprobs: true)",
        ),
        (request.modalities not in (None, ["text"]), "modalities", "the policy answers in text only"),
        (request.audio is not None, "audio", "the policy answers in text only"),
        (request.prediction is not None, "prediction", "predicted outputs are not offered"),
        (request.web_search_options is not None, "web_search_options", "the policy has no web search"),
    ]
    for refused, field, why in checks:
        if refused:
            return f"This policy server does not support {field}: {why}."
    return None


_BRANCHES = {"str", "int", "float", "bool", "list", "dict", "none"}


def describe_validation_error(error: ValidationError) -> str:
    """One sentence naming the most specific problem (and how many more there are)."""
    problems = error.errors(include_url=False)
    # A value failing a union fails every branch; the deepest location names the real mistake.
    first = max(problems, key=lambda problem: len(problem["loc"]))
    if first["type"] == "json_invalid":
        return f"The request body is not valid JSON: {first['msg']}."
    # Union branch labels ("str", "list[...]") name pydantic's attempts, not the caller's fields.
    parts = [
        str(part)
        for part in first["loc"]
        if not (isinstance(part, str) and (part in _BRANCHES or "[" in part))
    ]
    where = ".".join(parts) or "body"
    extra = len(problems) - 1
    more = f" ({extra} more problem{'s' if extra > 1 else ''})" if extra else ""
    return f"Invalid request: {where}: {first['msg']}{more}."


def has_images(request: ChatCompletionRequest) -> bool:
    return any(
        isinstance(part, ImagePart)
        for message in request.messages
        if isinstance(message.content, list)
        for part in message.content
    )


def _normalise_message(message: Message) -> dict[str, Any]:
    """An OpenAI message dict with plain-string content (parts kept as a list only when images are in)."""
    content = message.content
    if isinstance(content, list):
        if any(isinstance(part, ImagePart) for part in content):
            normalised_content: str | list[dict[str, Any]] = [
                part.model_dump(exclude_none=True) for part in content
            ]
        else:
            # vLLM joins text parts the same way, so both engines render one prompt.
            normalised_content = "\n".join(part.text for part in content if isinstance(part, TextPart))
    else:
        normalised_content = content or ""
    normalised: dict[str, Any] = {"role": message.role, "content": normalised_content}
    if message.name is not None:
        normalised["name"] = message.name
    if message.tool_calls:
        normalised["tool_calls"] = [call.model_dump() for call in message.tool_calls]
    if message.tool_call_id is not None:
        normalised["tool_call_id"] = message.tool_call_id
    if message.reasoning_content is not None:
        normalised["reasoning_content"] = message.reasoning_content
    return normalised


def generation_request(request: ChatCompletionRequest, *, max_tokens_cap: int) -> GenerationRequest:
    """The engine's view of a validated request, within the job's ``max_tokens`` cap."""
    max_tokens = request.max_completion_tokens or request.max_tokens or max_tokens_cap
    if max_tokens > max_tokens_cap:
        raise Rejection(
            400,
            f"The requested max_tokens {max_tokens} is above this job's cap of {max_tokens_cap}; "
            f"ask for {max_tokens_cap} or fewer.",
        )
    stop = [request.stop] if isinstance(request.stop, str) else request.stop
    tool_choice = request.tool_choice
    return GenerationRequest(
        messages=[_normalise_message(message) for message in request.messages],
        max_tokens=max_tokens,
        temperature=request.temperature,
        top_p=request.top_p,
        tools=[tool.model_dump(exclude_none=True) for tool in request.tools] if request.tools else None,
        tool_choice=tool_choice.model_dump() if isinstance(tool_choice, NamedToolChoice) else tool_choice,
        stop=stop or None,
        seed=request.seed,
        reasoning_effort=request.reasoning_effort,
        chat_template_kwargs=dict(request.chat_template_kwargs or {}),
    )
