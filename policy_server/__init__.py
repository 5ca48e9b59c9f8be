"""The policy server: an OpenAI-compatible gateway that records the exact tokens of every call.

Engines (``policy_server.engines.hf``, ``policy_server.engines.vllm``) are imported on their own, so
this package imports without torch.
"""

from policy_server.jobs import JobLimits, Rejection
from policy_server.running import ServerThread
from policy_server.server import EngineError, PolicyServer
from policy_server.trace import CallRecord, RolloutTrace, TokenCounters

__all__ = [
    "CallRecord",
    "EngineError",
    "JobLimits",
    "PolicyServer",
    "Rejection",
    "RolloutTrace",
    "ServerThread",
    "TokenCounters",
]
