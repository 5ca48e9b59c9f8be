"""The rollout context: everything one rollout needs to call its policy, made fresh per rollout.

Every client a :class:`RolloutContext` hands out is pointed at ``{endpoint}/v1`` and carries this
rollout's attribution headers, so concurrent rollouts on one app never share headers or clients.
"""

from __future__ import annotations

import functools
import ssl
import time
from typing import TYPE_CHECKING, Any

import httpx

from handlers.protocol import (
    JOB_ARN_HEADER,
    TRAJECTORY_ID_HEADER,
    InferenceParams,
    RolloutPayload,
)

if TYPE_CHECKING:
    import openai
    from strands.models.openai import OpenAIModel

DEFAULT_MODEL_ID = "default"
# The openai client insists on some key; a policy server without auth ignores it.
UNAUTHENTICATED_API_KEY = "rftkit-no-key"
# A model call's timeout when the payload names no deadline (the service's own payloads): the
# libraries' defaults (600 s, 2 retries) could hold an episode for half an hour.
DEFAULT_CALL_TIMEOUT_S = 120.0
DEFAULT_CALL_RETRIES = 1
CONNECT_TIMEOUT_S = 10.0


@functools.cache
def shared_ssl_context() -> ssl.SSLContext:
    """One TLS context for every client this process makes: building one costs milliseconds of CPU."""
    return httpx.create_ssl_context()


class InvalidRowError(ValueError):
    """Raise from a rollout function when the row itself cannot be played (not the agent's fault).

    The wrapper answers 400 with the message and reports the rollout failed; any other exception is
    the agent's own failure and answers 500.
    """


class MissingEndpointError(RuntimeError):
    """The payload named no policy endpoint, so there is nothing to point a model client at."""


class RolloutContext:
    """One rollout's view of its payload, with model clients pointed at the rollout's endpoint.

    ``row`` is the dataset row: the payload's ``prompt`` as sent, or parsed from JSON when the handler
    declared ``row_format="json"``. ``request_context`` is AgentCore's request context, when the app
    passed one.
    """

    def __init__(self, payload: RolloutPayload, row: Any, request_context: Any = None) -> None:
        self.payload = payload
        self.row = row
        self.request_context = request_context
        timeout_s = payload.rftkit.timeout_s if payload.rftkit is not None else None
        # When the trainer stops waiting for this rollout; every model call ends by then.
        self.deadline = time.monotonic() + timeout_s if timeout_s is not None else None

    def call_timeout(self) -> httpx.Timeout:
        """A model call's timeout: what is left until the rollout's deadline (or a bounded default)."""
        if self.deadline is None:
            return httpx.Timeout(DEFAULT_CALL_TIMEOUT_S, connect=CONNECT_TIMEOUT_S)
        left = max(self.deadline - time.monotonic(), 0.001)
        return httpx.Timeout(left, connect=min(left, CONNECT_TIMEOUT_S))

    @property
    def call_retries(self) -> int:
        """Retries the openai client may make: none within a deadline, which a retry would overrun."""
        return 0 if self.deadline is not None else DEFAULT_CALL_RETRIES

    @property
    def job_arn(self) -> str:
        return self.payload.metadata.job_arn

    @property
    def rollout_id(self) -> str:
        return self.payload.metadata.rollout_id

    @property
    def endpoint(self) -> str | None:
        """Base URL of the policy endpoint (no trailing ``/v1``), or None when the payload named none."""
        return self.payload.metadata.endpoint

    @property
    def inference_params(self) -> InferenceParams:
        return self.payload.inference_params or InferenceParams()

    @property
    def model_id(self) -> str:
        extras = self.payload.rftkit
        return extras.model if extras is not None and extras.model else DEFAULT_MODEL_ID

    @property
    def api_key(self) -> str | None:
        extras = self.payload.rftkit
        return extras.api_key if extras is not None else None

    @property
    def headers(self) -> dict[str, str]:
        """The headers every model call of this rollout must carry (a new dict on every access)."""
        headers = {JOB_ARN_HEADER: self.job_arn, TRAJECTORY_ID_HEADER: self.rollout_id}
        if self.api_key:
            headers["Authorization"] = f"Bearer {self.api_key}"
        return headers

    def openai_params(self) -> dict[str, Any]:
        """The job's sampling parameters spelled for ``chat.completions.create``."""
        return self.inference_params.openai_params()

    def client_args(self) -> dict[str, Any]:
        """Keyword arguments for ``openai.OpenAI`` / ``openai.AsyncOpenAI`` aimed at this rollout.

        Timeouts end every call by the rollout's deadline; the clients this context makes also never
        follow a redirect, which could lead a call (with this rollout's key) off the endpoint.
        """
        if self.endpoint is None:
            raise MissingEndpointError(
                "the payload has no metadata.endpoint, so this rollout has no model to call: "
                "send the policy endpoint's base URL in metadata.endpoint"
            )
        return {
            "base_url": f"{self.endpoint}/v1",
            "api_key": self.api_key or UNAUTHENTICATED_API_KEY,
            "default_headers": self.headers,
            "timeout": self.call_timeout(),
            "max_retries": self.call_retries,
        }

    def openai_client(self, **overrides: Any) -> openai.OpenAI:
        """A synchronous OpenAI client for this rollout; ``overrides`` go to ``openai.OpenAI``."""
        import openai

        http_client = openai.DefaultHttpxClient(verify=shared_ssl_context(), follow_redirects=False)
        return openai.OpenAI(**{**self.client_args(), "http_client": http_client, **overrides})

    def async_openai_client(self, **overrides: Any) -> openai.AsyncOpenAI:
        """An asynchronous OpenAI client for this rollout; ``overrides`` go to ``openai.AsyncOpenAI``."""
        import openai

        http_client = openai.DefaultAsyncHttpxClient(verify=shared_ssl_context(), follow_redirects=False)
        return openai.AsyncOpenAI(**{**self.client_args(), "http_client": http_client, **overrides})

    def strands_model(self, **overrides: Any) -> OpenAIModel:
        """A Strands ``OpenAIModel`` for this rollout.

        ``overrides`` replace sampling parameters (``temperature=0.2``) or add request fields
        (``extra_body={...}``); ``model_id=`` replaces the model name. Its calls end by the
        rollout's deadline (the timeout is what is left when this model is made) and follow no
        redirect.
        """
        model_id = overrides.pop("model_id", self.model_id)
        return _rollout_model_class()(
            client_args=self.client_args(),
            model_id=model_id,
            params={**self.openai_params(), **overrides},
        )


@functools.cache
def _rollout_model_class() -> type[OpenAIModel]:
    """Strands' ``OpenAIModel``, giving each request's client an http client that follows no redirect."""
    import openai
    from strands.models.openai import OpenAIModel

    class RolloutOpenAIModel(OpenAIModel):
        def _resolve_client_args(self) -> dict[str, Any]:
            # Strands makes (and closes) a client per request, so the http client is made per request too.
            http_client = openai.DefaultAsyncHttpxClient(verify=shared_ssl_context(), follow_redirects=False)
            return {**super()._resolve_client_args(), "http_client": http_client}

    return RolloutOpenAIModel
