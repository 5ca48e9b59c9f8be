"""Fixtures for the agent-side tests: the suite's scripted model server (``tests/scripted_model.py``)
on loopback, a way to serve any app, and rollout payloads."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import ExitStack
from typing import Any

import pytest

from handlers.serving import serve_in_thread
from tests.scripted_model import ScriptedModel


@pytest.fixture
def model() -> Iterator[ScriptedModel]:
    """A scripted model server listening on 127.0.0.1 (free port) for the test's duration."""
    scripted = ScriptedModel()
    with serve_in_thread(scripted.app()) as url:
        scripted.url = url
        yield scripted


@pytest.fixture
def serve() -> Iterator[Callable[[Any], str]]:
    """Serve any ASGI app on 127.0.0.1 (free port) until the test ends; returns its base URL."""
    with ExitStack() as stack:
        yield lambda app: stack.enter_context(serve_in_thread(app))


def rollout_payload(
    rollout_id: str, endpoint: str | None, prompt: Any = "row", **extra: Any
) -> dict[str, Any]:
    """A valid rollout payload in the service's spelling."""
    metadata: dict[str, Any] = {
        "jobArn": "arn:aws:sagemaker:us-west-2:111122223333:training-job/t",
        "rolloutId": rollout_id,
    }
    if endpoint is not None:
        metadata["endpoint"] = endpoint
    return {"prompt": prompt, "metadata": metadata, **extra}


@pytest.fixture
def payload() -> Callable[..., dict[str, Any]]:
    return rollout_payload
