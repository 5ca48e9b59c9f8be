"""`rft smoke` checks the credential path as a run will: its stand-in endpoint demands the key the
payload hands the agent (or, with --accept-sagemaker-tokens, a SageMaker token), the report says
which credential the agent sent, and an agent a run would refuse is never HEALTHY."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import pytest

from handlers import RolloutContext, rft_app
from handlers.smoke_cli import main as smoke
from tests.policy_server.test_sigv4_token import sign

TEMPLATE_PAYLOAD = Path(__file__).resolve().parents[2] / "agents" / "template" / "payloads" / "smoke.json"


def _own_credential_app(bearer: str | None) -> Any:
    """An agent that calls the model over plain HTTP with the rollout's headers but its own credential
    (``bearer``, or none), scores any refusal as its no-play reward, and reports through rft_app."""

    def rollout(row: Any, ctx: RolloutContext) -> float:
        headers = {name: value for name, value in ctx.headers.items() if name != "Authorization"}
        if bearer is not None:
            headers["Authorization"] = f"Bearer {bearer}"
        body = {"model": ctx.model_id, "messages": [{"role": "user", "content": "hi"}]}
        answer = httpx.post(f"{ctx.endpoint}/v1/chat/completions", json=body, headers=headers, timeout=10)
        return -1.0 if answer.status_code >= 400 else 0.0

    return rft_app(rollout)


def test_the_template_sends_the_key_it_was_handed_and_is_healthy(
    serve: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    from agents.template.main import app

    assert smoke([serve(app), "--payload", str(TEMPLATE_PAYLOAD), "--api-key", "the-run-key"]) == 0
    printed = capsys.readouterr().out
    assert (
        "credential the agent sent: the API key; a run demands the API key the payload handed the agent"
        in printed
    )
    assert "HEALTHY" in printed


def test_an_agent_without_the_key_is_refused_as_a_run_would_and_told_why(
    serve: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    url = serve(_own_credential_app(None))
    assert smoke([url, "--payload", str(TEMPLATE_PAYLOAD), "--timeout", "30"]) == 4
    printed = capsys.readouterr().out
    assert "HEALTHY" not in printed
    # The model call carried none, rft_app's reports the key the payload handed the agent.
    assert "credential the agent sent: no credential, the API key" in printed
    assert (
        "ACCESS DENIED: a run refuses the agent's calls (401 'Missing or wrong API key: send the header "
        "'Authorization: Bearer <key>'.'): they carried no credential, not the key the payload hands the "
        "agent (rftkit.apiKey)" in printed
    )
    # A run without a key takes the same agent: smoke --no-api-key says so.
    assert smoke([url, "--payload", str(TEMPLATE_PAYLOAD), "--no-api-key"]) == 0
    assert "credential the agent sent: no credential; a run demands none" in capsys.readouterr().out


def test_a_sagemaker_token_needs_accept_sagemaker_tokens_as_in_a_run(
    serve: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    fresh = sign(at=datetime.now(UTC).replace(microsecond=0))
    url = serve(_own_credential_app(fresh))
    assert smoke([url, "--payload", str(TEMPLATE_PAYLOAD), "--timeout", "30"]) == 4
    printed = capsys.readouterr().out
    assert "a SageMaker bearer token" in printed and "HEALTHY" not in printed
    assert (
        "policy_server.accept_sagemaker_tokens: true; set it and run rft smoke --accept-sagemaker-tokens"
        in (printed)
    )

    assert smoke([url, "--payload", str(TEMPLATE_PAYLOAD), "--accept-sagemaker-tokens"]) == 0
    printed = capsys.readouterr().out
    assert "credential the agent sent: a SageMaker bearer token, the API key; a run demands the API key" in (
        printed
    )
    # A stale token is refused as the gateway refuses it, with its reason.
    stale = serve(_own_credential_app(sign()))
    assert smoke([stale, "--payload", str(TEMPLATE_PAYLOAD), "--accept-sagemaker-tokens"]) == 4
    assert "a run refuses the agent's SageMaker token (401): " in capsys.readouterr().out
