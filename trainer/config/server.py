"""The policy_server section: the gateway the agents call."""

from __future__ import annotations

import secrets

from pydantic import (
    Field,
    field_validator,
    model_validator,
)

from handlers import exposure_refusal, http_url
from policy_server import (
    DEFAULT_MAX_IMAGE_BYTES,
    DEFAULT_MAX_IMAGE_PIXELS,
    DEFAULT_MAX_IMAGES_PER_CALL,
    ImageLimits,
)
from trainer.config.common import _Section

# policy_server.api_key's value that turns the agents' authentication off.
NO_API_KEY = "none"


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
        min_length=1,
        description="Bearer key agents must send on the routes they call (/v1, feedback, /health); "
        "it is handed to every agent in its payload (rftkit.apiKey) and opens no admin operation. "
        "Unset: a fresh random key for each run (never logged in full). `none`: no authentication "
        "(on a non-loopback host only with accept_sagemaker_tokens or allow_unauthenticated_network).",
    )
    allow_unauthenticated_network: bool = Field(
        default=False,
        description="Serve a host reachable from other machines with no credential check (api_key: "
        "none without accept_sagemaker_tokens): anyone who reaches it can use the model and send calls "
        "and rewards into the run's rollouts. Off: such a run refuses to start, saying so.",
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

    def agents_key(self) -> str | None:
        """The key this run's agents must send: the config's, None for `none`, else a fresh one (each
        call draws another: a run asks once)."""
        if self.api_key is None:
            return f"rft-{secrets.token_urlsafe(24)}"
        return None if self.api_key.lower() == NO_API_KEY else self.api_key

    @model_validator(mode="after")
    def _guarded_when_reachable(self) -> PolicyServerConfig:
        unguarded = self.api_key is not None and self.api_key.lower() == NO_API_KEY
        refusal = exposure_refusal(self.host, None if unguarded else "key", self.accept_sagemaker_tokens)
        if refusal is not None and not self.allow_unauthenticated_network:
            raise ValueError(refusal)
        return self

    @field_validator("public_url")
    @classmethod
    def _http_url(cls, value: str | None) -> str | None:
        return None if value is None else http_url(value)
