"""Agent side of rftkit: the rollout wire protocol, ``@rft_handler``, the rollout context, ``rft smoke``.

Light by design: importable without torch, so an agent container installs only the base package.
"""

from typing import TYPE_CHECKING, Any

from handlers.context import InvalidRowError, RolloutContext
from handlers.episode_errors import ends_episode, refused_by_endpoint
from handlers.loop_thread import LoopThread
from handlers.protocol import (
    JOB_ARN_HEADER,
    RFTKIT_KEY,
    TRAJECTORY_ID_HEADER,
    CompleteRolloutRequest,
    InferenceParams,
    RolloutMetadata,
    RolloutPayload,
    RolloutResponse,
    UpdateRewardRequest,
)

if TYPE_CHECKING:
    from handlers.decorator import rft_app, rft_handler


def __getattr__(name: str) -> Any:
    # The decorator pulls in bedrock-agentcore; the trainer and policy server import only the protocol.
    if name in ("rft_app", "rft_handler"):
        from handlers import decorator

        return getattr(decorator, name)
    raise AttributeError(f"module 'handlers' has no attribute {name!r}")


__all__ = [
    "JOB_ARN_HEADER",
    "RFTKIT_KEY",
    "TRAJECTORY_ID_HEADER",
    "CompleteRolloutRequest",
    "InferenceParams",
    "InvalidRowError",
    "LoopThread",
    "RolloutMetadata",
    "RolloutPayload",
    "RolloutContext",
    "RolloutResponse",
    "UpdateRewardRequest",
    "ends_episode",
    "refused_by_endpoint",
    "rft_app",
    "rft_handler",
]
