"""Agent side of rftkit: the rollout wire protocol, ``@rft_handler``, the rollout context, ``rft smoke``.

Light by design: importable without torch, so an agent container installs only the base package. This
``__init__`` is the package's public surface; names load on first use, so importing the protocol
does not pull in bedrock-agentcore, strands, openai or uvicorn.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from handlers.lazy import lazy_attributes

_LAZY: dict[str, str] = {
    # the wire protocol, defined once
    **dict.fromkeys(
        [
            "CHAT_COMPLETIONS_PATH",
            "COMPLETE_ROLLOUT_PATH",
            "JOB_ARN_HEADER",
            "JOB_NOT_FOUND_MESSAGE",
            "RFTKIT_KEY",
            "TRAJECTORY_ID_HEADER",
            "UPDATE_REWARD_PATH",
            "CompleteRolloutRequest",
            "InferenceParams",
            "ResultStatus",
            "RftkitExtras",
            "RolloutMetadata",
            "RolloutPayload",
            "RolloutResponse",
            "RolloutStatus",
            "UpdateRewardRequest",
        ],
        "handlers.protocol",
    ),
    # child processes that end with their parent
    "tied_popen": "handlers.processes",
    # writing an agent
    "rft_app": "handlers.decorator",
    "rft_handler": "handlers.decorator",
    "InvalidRowError": "handlers.context",
    "MissingEndpointError": "handlers.context",
    "RolloutContext": "handlers.context",
    "ends_episode": "handlers.episode_errors",
    "refused_by_endpoint": "handlers.episode_errors",
    "report_rollout": "handlers.reporting",
    "report_rollout_async": "handlers.reporting",
    # calling an agent (rft smoke and the trainer's fan-out)
    **dict.fromkeys(
        [
            "ERROR_TEXT_CHARS",
            "RUNTIME_ARN_FORM",
            "AgentAnswer",
            "FailureCause",
            "RETRYABLE_STATUS",
            "agentcore_client",
            "arn_region",
            "client_error_answer",
            "error_message",
            "invocations_url",
            "invoke_runtime",
            "is_runtime_arn",
            "read_answer",
            "retry_delay",
            "runtime_session_id",
            "unreachable",
        ],
        "handlers.agent_client",
    ),
    "http_url": "handlers.urls",
    # the credential on an agent's calls, judged once (the gateway's check, and rft smoke's)
    "agent_refusal": "handlers.credentials",
    "credential_sent": "handlers.credentials",
    "exposure_refusal": "handlers.credentials",
    "is_loopback": "handlers.credentials",
    # the bearer tokens AWS's SageMaker SDK signs (the gateway's check, and rft smoke's)
    **dict.fromkeys(
        ["TOKEN_PREFIX", "SageMakerTokenPolicy", "TokenRejected", "check_token", "parse_token"],
        "handlers.sagemaker_tokens",
    ),
    # running servers and event loops in threads
    "LoopThread": "handlers.loop_thread",
    "lazy_attributes": "handlers.lazy",
    **dict.fromkeys(
        [
            "HEADER_TIMEOUT_S",
            "KEEP_ALIVE_S",
            "MAX_CONNECTIONS",
            "QuietShutdown",
            "START_TIMEOUT_S",
            "STOP_TIMEOUT_S",
            "ServingThread",
            "protocol_with_header_timeout",
            "serve_in_thread",
        ],
        "handlers.serving",
    ),
}

if TYPE_CHECKING:
    from handlers.agent_client import (
        ERROR_TEXT_CHARS,
        RETRYABLE_STATUS,
        RUNTIME_ARN_FORM,
        AgentAnswer,
        FailureCause,
        agentcore_client,
        arn_region,
        client_error_answer,
        error_message,
        invocations_url,
        invoke_runtime,
        is_runtime_arn,
        read_answer,
        retry_delay,
        runtime_session_id,
        unreachable,
    )
    from handlers.context import InvalidRowError, MissingEndpointError, RolloutContext
    from handlers.credentials import agent_refusal, credential_sent, exposure_refusal, is_loopback
    from handlers.decorator import rft_app, rft_handler
    from handlers.episode_errors import ends_episode, refused_by_endpoint
    from handlers.lazy import lazy_attributes
    from handlers.loop_thread import LoopThread
    from handlers.processes import tied_popen
    from handlers.protocol import (
        CHAT_COMPLETIONS_PATH,
        COMPLETE_ROLLOUT_PATH,
        JOB_ARN_HEADER,
        JOB_NOT_FOUND_MESSAGE,
        RFTKIT_KEY,
        TRAJECTORY_ID_HEADER,
        UPDATE_REWARD_PATH,
        CompleteRolloutRequest,
        InferenceParams,
        ResultStatus,
        RftkitExtras,
        RolloutMetadata,
        RolloutPayload,
        RolloutResponse,
        RolloutStatus,
        UpdateRewardRequest,
    )
    from handlers.reporting import report_rollout, report_rollout_async
    from handlers.sagemaker_tokens import (
        TOKEN_PREFIX,
        SageMakerTokenPolicy,
        TokenRejected,
        check_token,
        parse_token,
    )
    from handlers.serving import (
        HEADER_TIMEOUT_S,
        KEEP_ALIVE_S,
        MAX_CONNECTIONS,
        START_TIMEOUT_S,
        STOP_TIMEOUT_S,
        QuietShutdown,
        ServingThread,
        protocol_with_header_timeout,
        serve_in_thread,
    )
    from handlers.urls import http_url

__all__ = [
    "tied_popen",
    "AgentAnswer",
    "CHAT_COMPLETIONS_PATH",
    "COMPLETE_ROLLOUT_PATH",
    "CompleteRolloutRequest",
    "ERROR_TEXT_CHARS",
    "FailureCause",
    "HEADER_TIMEOUT_S",
    "InferenceParams",
    "InvalidRowError",
    "JOB_ARN_HEADER",
    "JOB_NOT_FOUND_MESSAGE",
    "KEEP_ALIVE_S",
    "LoopThread",
    "MAX_CONNECTIONS",
    "MissingEndpointError",
    "RETRYABLE_STATUS",
    "RFTKIT_KEY",
    "RUNTIME_ARN_FORM",
    "ResultStatus",
    "RftkitExtras",
    "RolloutContext",
    "RolloutMetadata",
    "RolloutPayload",
    "RolloutResponse",
    "RolloutStatus",
    "START_TIMEOUT_S",
    "STOP_TIMEOUT_S",
    "QuietShutdown",
    "ServingThread",
    "TRAJECTORY_ID_HEADER",
    "UPDATE_REWARD_PATH",
    "UpdateRewardRequest",
    "agentcore_client",
    "arn_region",
    "client_error_answer",
    "error_message",
    "ends_episode",
    "invocations_url",
    "invoke_runtime",
    "is_runtime_arn",
    "protocol_with_header_timeout",
    "read_answer",
    "retry_delay",
    "refused_by_endpoint",
    "report_rollout",
    "report_rollout_async",
    "rft_app",
    "rft_handler",
    "runtime_session_id",
    "serve_in_thread",
    "unreachable",
    "http_url",
    "lazy_attributes",
    "agent_refusal",
    "credential_sent",
    "exposure_refusal",
    "is_loopback",
    "TOKEN_PREFIX",
    "SageMakerTokenPolicy",
    "TokenRejected",
    "check_token",
    "parse_token",
]

__getattr__ = lazy_attributes(__name__, _LAZY)
