"""``ForwardEngine``: the gateway's calls forwarded to any OpenAI-compatible chat endpoint.

For a teacher that is not served here (a hosted model, another team's server): the agents still call
rftkit's gateway, which attributes each call to its rollout and records it, and this engine forwards
the call (messages, tools, sampling settings) with the endpoint's own key. Such an endpoint returns
text, not token ids, so the record holds no ids (nothing to train on by GRPO) but keeps the reply
(``CallRecord.answer``): enough for demonstrations, which ``rft sft`` renders again from messages.
Adapters are the endpoint's business: loading one is refused.
"""

from __future__ import annotations

from typing import Any

import httpx

from handlers import http_url
from policy_server.engines.base import GenerationRequest, GenerationResult
from policy_server.errors import EngineError

FORWARD_TIMEOUT_S = 600.0  # one chat call of a large hosted model may take minutes


class ForwardEngine:
    """Forwards chat calls to ``base_url`` (an OpenAI-compatible ``.../v1``) as ``model`` with ``api_key``."""

    def __init__(self, base_url: str, *, model: str, api_key: str | None = None) -> None:
        self.base_url = http_url(base_url, "the teacher endpoint")
        self.model_name = model
        self._api_key = api_key
        self._client: httpx.AsyncClient | None = None
        self.prompt_tokens = 0  # as the endpoint's usage reports them
        self.completion_tokens = 0

    async def start(self) -> None:
        headers = {"Authorization": f"Bearer {self._api_key}"} if self._api_key else {}
        self._client = httpx.AsyncClient(
            base_url=self.base_url, headers=headers, timeout=FORWARD_TIMEOUT_S, follow_redirects=False
        )

    async def close(self) -> None:
        if self._client is not None:
            await self._client.aclose()
            self._client = None

    def request_body(self, request: GenerationRequest) -> dict[str, Any]:
        """The chat call as the endpoint gets it: the agent's messages, tools and sampling settings."""
        body: dict[str, Any] = {
            "model": self.model_name,
            "messages": request.messages,
            "max_tokens": request.max_tokens,
            "temperature": request.temperature,
            "top_p": request.top_p,
        }
        optional = {
            "tools": request.tools,
            "tool_choice": request.tool_choice,
            "stop": request.stop,
            "seed": request.seed,
            "reasoning_effort": request.reasoning_effort,
        }
        return body | {key: value for key, value in optional.items() if value}

    async def generate(self, request: GenerationRequest) -> GenerationResult:
        if self._client is None:
            raise EngineError("the forwarding engine has not been started")
        try:
            response = await self._client.post("/chat/completions", json=self.request_body(request))
        except httpx.HTTPError as error:
            raise EngineError(f"the teacher endpoint {self.base_url} is unreachable: {error!r}") from error
        if response.status_code != 200:
            raise EngineError(
                f"the teacher endpoint {self.base_url} answered {response.status_code}: {response.text[:300]}"
            )
        data = response.json()
        usage = data.get("usage") or {}
        self.prompt_tokens += int(usage.get("prompt_tokens") or 0)
        self.completion_tokens += int(usage.get("completion_tokens") or 0)
        choice = data["choices"][0]
        message = choice.get("message") or {}
        tool_calls = list(message.get("tool_calls") or [])
        finish_reason = choice.get("finish_reason") or "stop"
        return GenerationResult(
            prompt_token_ids=[],
            completion_token_ids=[],
            completion_logprobs=[],
            logprobs_mode="raw",
            finish_reason="tool_calls" if tool_calls and finish_reason == "stop" else finish_reason,
            content=message.get("content"),
            tool_calls=tool_calls,
            reasoning_content=message.get("reasoning_content") or message.get("reasoning"),
        )

    async def load_adapter(self, version: int, path: str) -> None:
        raise EngineError(
            f"the teacher endpoint {self.base_url} serves its own model: it takes no adapter ({path})"
        )

    async def unload_adapter(self, version: int) -> None:
        return None
