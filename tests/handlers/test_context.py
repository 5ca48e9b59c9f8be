"""RolloutContext: every client it hands out aims at the rollout's endpoint with its headers and params."""

from __future__ import annotations

import asyncio
from typing import Any

import httpx
import pytest

from handlers import RolloutContext, rft_app
from handlers.context import MissingEndpointError
from handlers.protocol import JOB_ARN_HEADER, TRAJECTORY_ID_HEADER, RolloutPayload

JOB = "arn:aws:sagemaker:us-west-2:111122223333:training-job/t"


def context(payload: Any, **extra: Any) -> RolloutContext:
    body = payload("r7", "http://127.0.0.1:9000/", **extra)
    return RolloutContext(RolloutPayload.model_validate(body), body["prompt"])


def test_defaults_without_params_or_key(payload: Any) -> None:
    ctx = context(payload)
    assert ctx.model_id == "default" and ctx.openai_params() == {} and ctx.api_key is None
    assert ctx.headers == {JOB_ARN_HEADER: JOB, TRAJECTORY_ID_HEADER: "r7"}


def test_sync_and_async_openai_clients_point_at_the_endpoint(payload: Any) -> None:
    ctx = context(payload, rftkit={"api_key": "secret"})
    with ctx.openai_client() as client:
        assert str(client.base_url) == "http://127.0.0.1:9000/v1/"
        assert client.api_key == "secret"
        assert client.default_headers[TRAJECTORY_ID_HEADER] == "r7"
        assert client.default_headers[JOB_ARN_HEADER] == JOB

    async def check_async() -> None:
        async with ctx.async_openai_client(max_retries=0) as client:
            assert str(client.base_url) == "http://127.0.0.1:9000/v1/"
            assert client.default_headers[TRAJECTORY_ID_HEADER] == "r7"
            assert client.max_retries == 0

    asyncio.run(check_async())


def test_the_strands_model_carries_headers_model_and_sampling_params(payload: Any) -> None:
    ctx = context(
        payload,
        inferenceParams={"temperature": 0.7, "maxTokens": 128, "topP": 0.95},
        rftkit={"model": "policy"},
    )
    model = ctx.strands_model()
    assert model.client_args["base_url"] == "http://127.0.0.1:9000/v1"
    assert model.client_args["default_headers"] == ctx.headers
    assert model.get_config()["model_id"] == "policy"
    assert model.get_config()["params"] == {"temperature": 0.7, "max_tokens": 128, "top_p": 0.95}
    tuned = ctx.strands_model(temperature=0.0, extra_body={"reasoning_effort": "low"}, model_id="other")
    assert tuned.get_config()["model_id"] == "other"
    assert tuned.get_config()["params"] == {
        "temperature": 0.0,
        "max_tokens": 128,
        "top_p": 0.95,
        "extra_body": {"reasoning_effort": "low"},
    }


def test_without_an_endpoint_every_client_explains_what_is_missing(payload: Any) -> None:
    body = payload("r1", None)
    ctx = RolloutContext(RolloutPayload.model_validate(body), body["prompt"])
    for make in (ctx.openai_client, ctx.async_openai_client, ctx.strands_model):
        with pytest.raises(MissingEndpointError, match="metadata.endpoint"):
            make()

    async def run() -> httpx.Response:
        app = rft_app(lambda row, ctx: ctx.strands_model() and 0.0)
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://a") as client:
            return await client.post("/invocations", json=body)

    response = asyncio.run(run())
    # The payload's fault, not the agent's: a 400 naming what is missing.
    assert response.status_code == 400
    assert "invalid rollout payload: the payload has no metadata.endpoint" in response.json()["error"]
