"""The policy server: an OpenAI-compatible gateway that records the exact tokens of every call.

This is the package's public surface; its sub-packages (``http``, ``workers``, ``engines``, ``models``)
have their own. Names load on first use, so the learner and the config import this package without
starlette, openai or torch.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from handlers import lazy_attributes

# name -> (module, attribute): imported on first use, so importing this package stays light.
_LAZY: dict[str, tuple[str, str]] = {
    "CallRecord": ("policy_server.trace", "CallRecord"),
    "CallTicket": ("policy_server.jobs", "CallTicket"),
    "DEFAULT_MAX_IMAGES_PER_CALL": ("policy_server.http.images", "DEFAULT_MAX_IMAGES_PER_CALL"),
    "DEFAULT_MAX_IMAGE_BYTES": ("policy_server.http.images", "DEFAULT_MAX_IMAGE_BYTES"),
    "DEFAULT_MAX_IMAGE_PIXELS": ("policy_server.http.images", "DEFAULT_MAX_IMAGE_PIXELS"),
    "EngineError": ("policy_server.errors", "EngineError"),
    "GatewayPool": ("policy_server.workers.gateway_pool", "GatewayPool"),
    "ImageError": ("policy_server.http.images", "ImageError"),
    "ImageInput": ("policy_server.http.images", "ImageInput"),
    "ImageLimits": ("policy_server.http.images", "ImageLimits"),
    "ImageRef": ("policy_server.http.images", "ImageRef"),
    "ImageStore": ("policy_server.image_store", "ImageStore"),
    "JobLimits": ("policy_server.jobs", "JobLimits"),
    "JobRegistry": ("policy_server.jobs", "JobRegistry"),
    "PolicyServer": ("policy_server.server", "PolicyServer"),
    "RECORDED_TEXT_CHARS": ("policy_server.trace", "RECORDED_TEXT_CHARS"),
    "Rejection": ("policy_server.errors", "Rejection"),
    "RolloutTrace": ("policy_server.trace", "RolloutTrace"),
    "SageMakerTokenPolicy": ("handlers", "SageMakerTokenPolicy"),
    "ServerThread": ("policy_server.running", "ServerThread"),
    "TokenCounters": ("policy_server.trace", "TokenCounters"),
    "call_record": ("policy_server.recording", "call_record"),
    "clipped_for_record": ("policy_server.trace", "clipped_for_record"),
    "check_exposure": ("policy_server.running", "check_exposure"),
    "image_from_bytes": ("policy_server.http.images", "image_from_bytes"),
    "image_from_url": ("policy_server.http.images", "image_from_url"),
    "image_parts": ("policy_server.http.images", "image_parts"),
    "locate_images": ("policy_server.http.images", "locate_images"),
    "normalize_messages": ("policy_server.http.chat_format", "normalize_messages"),
    "parse_tool_calls": ("policy_server.http.chat_format", "parse_tool_calls"),
    "request_images": ("policy_server.http.images", "request_images"),
    "serve_gateway": ("policy_server.workers.gateway_pool", "serve_gateway"),
    "start_metrics_server": ("policy_server.http.metrics", "start_metrics_server"),
    "trace_key": ("policy_server.image_store", "trace_key"),
}

if TYPE_CHECKING:
    from handlers import SageMakerTokenPolicy
    from policy_server.errors import EngineError, Rejection
    from policy_server.http.chat_format import normalize_messages, parse_tool_calls
    from policy_server.http.images import (
        DEFAULT_MAX_IMAGE_BYTES,
        DEFAULT_MAX_IMAGE_PIXELS,
        DEFAULT_MAX_IMAGES_PER_CALL,
        ImageError,
        ImageInput,
        ImageLimits,
        ImageRef,
        image_from_bytes,
        image_from_url,
        image_parts,
        locate_images,
        request_images,
    )
    from policy_server.http.metrics import start_metrics_server
    from policy_server.image_store import ImageStore, trace_key
    from policy_server.jobs import CallTicket, JobLimits, JobRegistry
    from policy_server.recording import call_record
    from policy_server.running import ServerThread, check_exposure
    from policy_server.server import PolicyServer
    from policy_server.trace import (
        RECORDED_TEXT_CHARS,
        CallRecord,
        RolloutTrace,
        TokenCounters,
        clipped_for_record,
    )
    from policy_server.workers.gateway_pool import GatewayPool, serve_gateway

__all__ = [
    "CallRecord",
    "CallTicket",
    "DEFAULT_MAX_IMAGES_PER_CALL",
    "DEFAULT_MAX_IMAGE_BYTES",
    "DEFAULT_MAX_IMAGE_PIXELS",
    "EngineError",
    "GatewayPool",
    "ImageError",
    "ImageInput",
    "ImageLimits",
    "ImageRef",
    "ImageStore",
    "JobLimits",
    "JobRegistry",
    "PolicyServer",
    "RECORDED_TEXT_CHARS",
    "Rejection",
    "RolloutTrace",
    "SageMakerTokenPolicy",
    "ServerThread",
    "TokenCounters",
    "call_record",
    "clipped_for_record",
    "check_exposure",
    "image_from_bytes",
    "image_from_url",
    "image_parts",
    "locate_images",
    "normalize_messages",
    "parse_tool_calls",
    "request_images",
    "serve_gateway",
    "start_metrics_server",
    "trace_key",
]

__getattr__ = lazy_attributes(__name__, _LAZY)
