"""SageMaker SDK bearer tokens, checked offline: tokens signed the way the SDK signs them (botocore's
SigV4 query signer, fake credentials) pass; malformed, foreign, stale and unlisted ones are refused with
a sentence, and the gateway accepts them on the agents' routes only."""

from __future__ import annotations

import asyncio
import base64
from datetime import UTC, datetime, timedelta
from pathlib import Path
from unittest import mock

import httpx
import pytest
from botocore.auth import SigV4QueryAuth
from botocore.awsrequest import AWSRequest
from botocore.credentials import Credentials

from handlers.sagemaker_tokens import (
    SageMakerTokenPolicy,
    TokenRejected,
    check_token,
    parse_token,
)
from policy_server import PolicyServer
from policy_server.engines.hf import HFEngine

KEY_ID = "AKIAIOSFODNN7EXAMPLE"
NOW = datetime(2026, 11, 30, 12, 0, 0, tzinfo=UTC)


def sign(
    *,
    at: datetime = NOW,
    key_id: str = KEY_ID,
    region: str = "us-west-2",
    service: str = "sagemaker",
    host: str = "sagemaker.amazonaws.com",
    action: str = "CallWithBearerToken",
    expires: int = 3600,
) -> str:
    """A token as the SDK builds one: a SigV4-presigned URL, scheme dropped, base64, prefixed."""
    request = AWSRequest(
        method="POST", url=f"https://{host}/", headers={"host": host}, params={"Action": action}
    )
    with mock.patch("botocore.auth.datetime.datetime") as clock:
        clock.now.return_value = at.replace(tzinfo=None)
        clock.utcnow.return_value = at.replace(tzinfo=None)
        SigV4QueryAuth(Credentials(key_id, "secret"), service, region, expires=expires).add_auth(request)
    url = request.url.replace("https://", "") + "&Version=1"
    return "sagemaker-api-key-" + base64.b64encode(url.encode()).decode()


def test_a_token_signed_like_the_sdks_passes_with_its_claims() -> None:
    claims = check_token(sign(), now=NOW + timedelta(minutes=5), access_key_ids={KEY_ID})
    assert (claims.access_key_id, claims.region) == (KEY_ID, "us-west-2")
    assert claims.signed_at == NOW and claims.expires_at == NOW + timedelta(hours=1)


@pytest.mark.parametrize(
    ("token", "reason"),
    [
        ("sk-local-key", "does not start with 'sagemaker-api-key-'"),
        ("sagemaker-api-key-%%%not-base64", "is not base64"),
        (sign(host="evil.example.com"), "not for sagemaker.amazonaws.com"),
        (sign(action="ListModels"), "not an Action=CallWithBearerToken call"),
        (sign(service="s3"), "signed for the 's3' service"),
        (sign(region="mars"), "is not an AWS region"),
        (sign(at=NOW - timedelta(hours=2)), "expired at 2026-11-30T11:00:00Z"),
        (sign(at=NOW + timedelta(hours=1)), "signed in the future"),
        (sign(key_id="AKIAOTHERACCOUNT0000"), "AKIAOTHERACCOUNT0000 is not in the allow-list"),
    ],
)
def test_bad_tokens_are_refused_with_the_reason(token: str, reason: str) -> None:
    with pytest.raises(TokenRejected, match=reason.replace("(", r"\(")):
        check_token(token, now=NOW, access_key_ids={KEY_ID})


def test_a_tampered_date_breaks_the_credential_scope() -> None:
    url = base64.b64decode(sign().removeprefix("sagemaker-api-key-")).decode()
    tampered = url.replace("X-Amz-Date=20261130", "X-Amz-Date=20261201")
    with pytest.raises(TokenRejected, match="credential scope's date 20261130 is not the X-Amz-Date's"):
        parse_token("sagemaker-api-key-" + base64.b64encode(tampered.encode()).decode())


def _get(app: object, path: str, authorization: str) -> httpx.Response:
    async def run() -> httpx.Response:
        transport = httpx.ASGITransport(app=app)  # type: ignore[arg-type]
        async with httpx.AsyncClient(transport=transport, base_url="http://gateway") as client:
            return await client.get(path, headers={"Authorization": authorization})

    return asyncio.run(run())


def test_the_gateway_takes_fresh_tokens_on_agent_routes_and_keeps_admin_behind_its_key(
    tiny_model_dir: Path,
) -> None:
    policy = SageMakerTokenPolicy(access_key_ids=frozenset({KEY_ID}))
    server = PolicyServer(
        HFEngine(tiny_model_dir), api_key="agents-key", admin_key="admin-key", sagemaker_tokens=policy
    )
    fresh = sign(at=datetime.now(UTC).replace(microsecond=0))

    assert _get(server.app, "/v1/models", f"Bearer {fresh}").status_code == 200
    assert _get(server.app, "/v1/models", "Bearer agents-key").status_code == 200
    stale = _get(server.app, "/v1/models", f"Bearer {sign()}")
    assert stale.status_code == 401 and "SageMaker token (refused: the token expired" in stale.text
    # A SageMaker token is an agent's credential: it never opens the trainer's operations.
    admin = _get(server.app, "/admin/counters?job_arn=x", f"Bearer {fresh}")
    assert admin.status_code == 401 and "Missing or wrong admin key" in admin.text
    assert _get(server.app, "/admin/counters?job_arn=x", "Bearer admin-key").status_code != 401


def test_a_sagemaker_token_sent_to_a_gateway_that_does_not_take_them_is_told_the_setting(
    tiny_model_dir: Path,
) -> None:
    server = PolicyServer(HFEngine(tiny_model_dir), api_key="agents-key")
    fresh = sign(at=datetime.now(UTC).replace(microsecond=0))

    refused = _get(server.app, "/v1/models", f"Bearer {fresh}")
    assert refused.status_code == 401
    assert "the bearer sent is a SageMaker token" in refused.text
    assert "policy_server.accept_sagemaker_tokens: true" in refused.text
    assert "`rft serve --accept-sagemaker-tokens`" in refused.text
    # Any other wrong bearer gets the key's sentence alone, ending in one period.
    wrong = _get(server.app, "/v1/models", "Bearer not-the-key")
    assert wrong.status_code == 401 and "accept_sagemaker_tokens" not in wrong.text
    assert wrong.json()["error"]["message"].endswith("'Authorization: Bearer <key>'.")
