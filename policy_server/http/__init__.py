"""The gateway's HTTP layer: routes, credentials, request bodies and responses, the chat-completions
wire format (requests in ``chat_api``, answers in ``chat_replies``), images in requests, and the metrics port.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from handlers import lazy_attributes

# name -> (module, attribute): imported on first use, so importing this package stays light.
_LAZY: dict[str, tuple[str, str]] = {
    "AuthMiddleware": ("policy_server.http.auth", "AuthMiddleware"),
    "ChatCompletionRequest": ("policy_server.http.chat_api", "ChatCompletionRequest"),
    "CompletionIds": ("policy_server.http.chat_replies", "CompletionIds"),
    "SageMakerTokenPolicy": ("handlers", "SageMakerTokenPolicy"),
    "ServerMetrics": ("policy_server.http.metrics", "ServerMetrics"),
    "TokenRejected": ("handlers", "TokenRejected"),
    "build_app": ("policy_server.http.app", "build_app"),
    "check_token": ("handlers", "check_token"),
    "completion_body": ("policy_server.http.chat_replies", "completion_body"),
    "describe_validation_error": ("policy_server.http.chat_api", "describe_validation_error"),
    "error_response": ("policy_server.http.responses", "error_response"),
    "generation_request": ("policy_server.http.chat_api", "generation_request"),
    "normalize_messages": ("policy_server.http.chat_format", "normalize_messages"),
    "parse_model": ("policy_server.http.bodies", "parse_model"),
    "parse_request": ("policy_server.http.chat_api", "parse_request"),
    "parse_token": ("handlers", "parse_token"),
    "parse_tool_calls": ("policy_server.http.chat_format", "parse_tool_calls"),
    "read_body": ("policy_server.http.bodies", "read_body"),
    "refusal": ("policy_server.http.chat_api", "refusal"),
    "sampled_logprobs": ("policy_server.http.chat_replies", "sampled_logprobs"),
    "start_metrics_server": ("policy_server.http.metrics", "start_metrics_server"),
    "stream_chunks": ("policy_server.http.chat_replies", "stream_chunks"),
}

if TYPE_CHECKING:
    from handlers import SageMakerTokenPolicy, TokenRejected, check_token, parse_token
    from policy_server.http.app import build_app
    from policy_server.http.auth import AuthMiddleware
    from policy_server.http.bodies import parse_model, read_body
    from policy_server.http.chat_api import (
        ChatCompletionRequest,
        describe_validation_error,
        generation_request,
        parse_request,
        refusal,
    )
    from policy_server.http.chat_format import normalize_messages, parse_tool_calls
    from policy_server.http.chat_replies import (
        CompletionIds,
        completion_body,
        sampled_logprobs,
        stream_chunks,
    )
    from policy_server.http.metrics import ServerMetrics, start_metrics_server
    from policy_server.http.responses import error_response

__all__ = [
    "AuthMiddleware",
    "ChatCompletionRequest",
    "CompletionIds",
    "SageMakerTokenPolicy",
    "ServerMetrics",
    "TokenRejected",
    "build_app",
    "check_token",
    "completion_body",
    "describe_validation_error",
    "error_response",
    "generation_request",
    "normalize_messages",
    "parse_model",
    "parse_request",
    "parse_token",
    "parse_tool_calls",
    "read_body",
    "refusal",
    "sampled_logprobs",
    "start_metrics_server",
    "stream_chunks",
]

__getattr__ = lazy_attributes(__name__, _LAZY)
