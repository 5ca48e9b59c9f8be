"""A refused call is written into the rollout its headers name, where that rollout exists: its count
and its first refusal's status and sentence (the trainer's reason when it fails the rollout). A
refusal opens nothing: no rollout, no job, and an auto-opening job stays as it was."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from starlette.testclient import TestClient

from handlers.protocol import JOB_ARN_HEADER, TRAJECTORY_ID_HEADER
from policy_server import PolicyServer
from policy_server.engines.hf import HFEngine

KEY = "agents-key"
CHAT = {"model": "default", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}


def _headers(job: str, rollout: str, key: str) -> dict[str, Any]:
    return {"Authorization": f"Bearer {key}", JOB_ARN_HEADER: job, TRAJECTORY_ID_HEADER: rollout}


def test_refusals_are_recorded_in_the_named_rollout_and_open_nothing(tiny_model_dir: Path) -> None:
    server = PolicyServer(HFEngine(tiny_model_dir), api_key=KEY)
    server.open_job("job", max_tokens=4)
    server.open_rollout("job", "r")
    server.open_job("auto", max_tokens=4, auto_open_rollouts=True)
    with TestClient(server.app) as client:
        for _ in range(2):
            wrong = client.post("/v1/chat/completions", json=CHAT, headers=_headers("job", "r", "wrong"))
            assert wrong.status_code == 401
        too_long = {**CHAT, "max_tokens": 99}
        own = client.post("/v1/chat/completions", json=too_long, headers=_headers("job", "r", KEY))
        assert own.status_code == 400
        for job, rollout in (("auto", "fresh"), ("job", "unknown"), ("nojob", "r")):
            answer = client.post("/v1/chat/completions", json=CHAT, headers=_headers(job, rollout, "wrong"))
            assert answer.status_code == 401
        reward = {"JobArn": "job", "TrajectoryId": "r", "Rewards": [1.0]}
        feedback = client.post("/update-reward", json=reward, headers={"Authorization": "Bearer wrong"})
        assert feedback.status_code == 401

    assert server.registry.open_rollout_count("auto") == 0
    assert server.registry.open_rollout_count("job") == 1
    trace = server.take_trace("job", "r")
    assert (trace.rejected_calls, trace.auth_refused_calls, trace.calls, trace.rewards) == (1, 2, [], None)
    assert trace.first_refusal == (
        "HTTP 401: Missing or wrong API key: send the header 'Authorization: Bearer <key>'."
    )
    # Refusals for credentials came from whoever named the job: they move none of its counts.
    assert server.close_job("job").rejected_calls == 1
    assert server.close_job("auto").rejected_calls == 0
