"""Thousands of malformed payloads at a real app, in process: no 5xx from parsing, no hang, /ping answers.

Each hypothesis example is a batch of payloads sent concurrently, so a few thousand payloads cost a
hundred examples. Endpoints that parse point at a closed loopback port, so reports fail fast (and
are logged, never raised).
"""

from __future__ import annotations

import asyncio
import copy
import json
import socket
from typing import Any

import httpx
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from handlers import RolloutContext, rft_app

BATCH = 30
EXAMPLES = 100


def closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


DEAD_ENDPOINT = f"http://127.0.0.1:{closed_port()}"

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=10), inner, max_size=4),
    max_leaves=10,
)
VALID: dict[str, Any] = {
    "prompt": '{"secret": "crane"}',
    "metadata": {
        "jobArn": "arn:aws:sagemaker:us-east-1:1:training-job/f",
        "rolloutId": "r",
        "endpoint": DEAD_ENDPOINT,
    },
    "inferenceParams": {"temperature": 1.0, "maxTokens": 16, "topP": 1.0},
    "rftkit": {"model": "default"},
}
PATHS = [
    ("prompt",),
    ("metadata",),
    ("metadata", "jobArn"),
    ("metadata", "rolloutId"),
    ("metadata", "endpoint"),
    ("metadata", "region"),
    ("inferenceParams",),
    ("inferenceParams", "temperature"),
    ("inferenceParams", "maxTokens"),
    ("inferenceParams", "topP"),
    ("rftkit",),
    ("rftkit", "model"),
    ("rftkit", "api_key"),
]
DELETE = object()
junk = st.one_of(
    json_values, st.text(max_size=30), st.sampled_from(["", "http://", DEAD_ENDPOINT + "/v1/", "{}", "[1]"])
)
mutations = st.lists(
    st.tuples(st.sampled_from(PATHS), st.one_of(st.just(DELETE), junk)), min_size=1, max_size=3
)


def mutate(changes: list[tuple[tuple[str, ...], Any]]) -> Any:
    """A valid payload with one to three fields deleted or replaced by junk (mostly one defect)."""
    payload = copy.deepcopy(VALID)
    for path, value in changes:
        parent = payload
        for key in path[:-1]:
            parent = parent.get(key) if isinstance(parent, dict) else None
        if not isinstance(parent, dict):
            continue
        if value is DELETE:
            parent.pop(path[-1], None)
        else:
            parent[path[-1]] = value
    return payload


payloads = st.one_of(mutations.map(mutate), json_values)
# Some bodies are not even JSON: the app itself answers those.
bodies = st.one_of(payloads.map(lambda p: json.dumps(p).encode()), st.binary(max_size=40))


async def rollout(row: Any, ctx: RolloutContext) -> float:
    return 0.5


APP = rft_app(rollout, row_format="json")


@settings(
    max_examples=EXAMPLES,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(batch=st.lists(bodies, min_size=BATCH, max_size=BATCH))
def test_malformed_payloads_never_break_the_app(batch: list[bytes]) -> None:
    async def run() -> list[httpx.Response]:
        transport = httpx.ASGITransport(app=APP)
        async with httpx.AsyncClient(transport=transport, base_url="http://agent") as client:
            sent = [
                client.post("/invocations", content=body, headers={"content-type": "application/json"})
                for body in batch
            ]
            responses = await asyncio.wait_for(asyncio.gather(*sent), timeout=30)
            ping = await client.get("/ping")
            assert ping.status_code == 200 and ping.json()["status"] in ("Healthy", "HealthyBusy")
            return responses

    for body, response in zip(batch, asyncio.run(run()), strict=True):
        assert response.status_code in (200, 400), (body, response.status_code, response.text)
        if response.status_code == 400:
            error = response.json()["error"]
            assert isinstance(error, str) and error
        else:
            assert response.json()["reward"] == 0.5
