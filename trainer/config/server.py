"""The policy_server section: the gateway the agents call."""

from __future__ import annotations

from pydantic import (
    Field,
    field_validator,
)

from handlers import http_url
from policy_server import (
    DEFAULT_MAX_IMAGE_BYTES,
    DEFAULT_MAX_IMAGE_PIXELS,
    DEFAULT_MAX_IMAGES_PER_CALL,
    ImageLimits,
)
from trainer.config.common import _Section


class PolicyServerConfig(_Section):
    """Where the policy server (the OpenAI-compatible endpoint agents call) listens."""

    host: str = Field(default="127.0.0.1", description="Interface to bind; 0.0.0.0 to serve other machines.")
    port: int = Field(default=0, ge=0, le=65535, description="Port to bind; 0 picks a free one.")
    public_url: str | None = Field(
        default=None,
        description="Endpoint URL sent to agents when they reach the server by another address "
        "(a tunnel, a load balancer); unset: http://host:port.",
    )
    api_key: str | None = Field(
        default=None,
        description="Bearer key agents must send on the routes they call (/v1, feedback, /health); "
        "it is handed to every agent and opens no admin operation. Unset: no authentication.",
    )
    accept_sagemaker_tokens: bool = Field(
        default=False,
        description="Also accept, on the agents' routes, the bearer tokens AWS's SageMaker SDK "
        "(sagemaker-train) signs and sends in place of any key: checked offline for form, credential "
        "scope and expiry, not for their signature (see the README).",
    )
    sagemaker_access_key_ids: list[str] = Field(
        default_factory=list,
        description="With accept_sagemaker_tokens: the AWS access key ids a token may name; empty: any.",
    )
    metrics_port: int | None = Field(
        default=None,
        ge=0,
        le=65535,
        description="Port of Prometheus' /metrics (the policy server's and the trainer's step series), "
        "on the same host, apart from the port agents call; 0 picks a free one; unset: no metrics.",
    )
    max_image_bytes: int = Field(
        default=DEFAULT_MAX_IMAGE_BYTES,
        gt=0,
        description="Largest image file an agent may send (bytes after base64 decoding, per image); "
        "a larger one is refused with a 400.",
    )
    max_images_per_call: int = Field(
        default=DEFAULT_MAX_IMAGES_PER_CALL,
        gt=0,
        description="Most images one chat call may carry, counted over its whole conversation (a "
        "multi-turn episode re-sends earlier images); vLLM's per-prompt image limit too.",
    )
    max_image_pixels: int = Field(
        default=DEFAULT_MAX_IMAGE_PIXELS,
        gt=0,
        description="Most pixels (width x height) an image may have, checked before it is decoded; "
        "the model's image processor then resizes what it takes.",
    )

    def image_limits(self) -> ImageLimits:
        """The ``max_image*`` settings, as the gateway takes them."""
        return ImageLimits(self.max_image_bytes, self.max_images_per_call, self.max_image_pixels)

    gateway_workers: int = Field(
        default=1,
        ge=1,
        le=64,
        description="Gateway processes serving the agents' port (vllm engine only): 1 serves it from "
        "the trainer's process; more start that many worker processes sharing the port, the job state "
        "staying in the trainer's process (docs/architecture.md). Each worker uses up to one core; "
        "the cost per call is in bench/results/gateway_cpu.json and gateway_overhead.json.",
    )

    @field_validator("public_url")
    @classmethod
    def _http_url(cls, value: str | None) -> str | None:
        return None if value is None else http_url(value)
