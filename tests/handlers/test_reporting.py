"""Feedback posts: the right bodies and headers, in order; failures are logged, never raised."""

from __future__ import annotations

import asyncio
import logging
import socket
from typing import Any

import pytest
from starlette.applications import Starlette
from starlette.responses import JSONResponse
from starlette.routing import Route

from handlers.protocol import JOB_ARN_HEADER, TRAJECTORY_ID_HEADER, RolloutStatus
from handlers.reporting import report_rollout, report_rollout_async

JOB = "arn:aws:sagemaker:us-west-2:111122223333:training-job/t"


@pytest.mark.parametrize("use_async", [False, True], ids=["sync", "async"])
def test_rewards_then_completion_with_the_rollout_headers(use_async: bool, model: Any) -> None:
    if use_async:
        asyncio.run(report_rollout_async(model.url, JOB, "r1", RolloutStatus.READY, [0.5, 1.0], api_key="k"))
    else:
        report_rollout(model.url, JOB, "r1", RolloutStatus.READY, [0.5, 1.0], api_key="k")
    assert model.update_rewards == [{"JobArn": JOB, "TrajectoryId": "r1", "Rewards": [0.5, 1.0]}]
    assert model.complete_rollouts == [{"JobArn": JOB, "TrajectoryId": "r1", "Status": "ready"}]
    for headers in model.feedback_headers:
        assert (headers[JOB_ARN_HEADER.lower()], headers[TRAJECTORY_ID_HEADER.lower()]) == (JOB, "r1")
        assert headers["authorization"] == "Bearer k"


def test_a_failed_rollout_posts_only_its_completion(model: Any) -> None:
    report_rollout(model.url, JOB, "r2", RolloutStatus.FAILED)
    assert model.update_rewards == []
    assert model.complete_rollouts == [{"JobArn": JOB, "TrajectoryId": "r2", "Status": "failed"}]


def closed_port_url() -> str:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{sock.getsockname()[1]}"


@pytest.mark.parametrize("use_async", [False, True], ids=["sync", "async"])
def test_unreachable_refusing_or_malformed_endpoints_are_logged_not_raised(
    use_async: bool, serve: Any, caplog: pytest.LogCaptureFixture
) -> None:
    refusing = serve(
        Starlette(routes=[Route("/{path}", lambda r: JSONResponse({"error": "no"}, 503), methods=["POST"])])
    )
    expected = {closed_port_url(): "ConnectError", refusing: "HTTP 503", "http://[::1": "InvalidURL"}
    for endpoint, problem in expected.items():
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="handlers.reporting"):
            if use_async:
                asyncio.run(report_rollout_async(endpoint, JOB, "r3", RolloutStatus.READY, [1.0]))
            else:
                report_rollout(endpoint, JOB, "r3", RolloutStatus.READY, [1.0])
        messages = [record.getMessage() for record in caplog.records]
        assert len(messages) == 2, messages
        assert all(message.startswith(f"could not report rollout r3 to {endpoint}/") for message in messages)
        assert all(problem in message for message in messages), messages


@pytest.mark.parametrize("use_async", [False, True], ids=["sync", "async"])
def test_reports_that_cannot_be_formed_are_logged_not_raised(
    use_async: bool, model: Any, caplog: pytest.LogCaptureFixture
) -> None:
    bad = [("r\u00e9", [1.0]), ("r\n2", [1.0]), ("r4", [float("nan")]), ("r5", [])]
    with caplog.at_level(logging.WARNING, logger="handlers.reporting"):
        for rollout_id, rewards in bad:
            if use_async:
                asyncio.run(report_rollout_async(model.url, JOB, rollout_id, RolloutStatus.READY, rewards))
            else:
                report_rollout(model.url, JOB, rollout_id, RolloutStatus.READY, rewards)
    # Each is logged (an id with a newline fails at each post, the others before any post).
    assert {record.args[0] for record in caplog.records} == {rollout_id for rollout_id, _ in bad}
    assert model.update_rewards == [] and model.complete_rollouts == []
