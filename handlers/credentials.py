"""The credential on an agent's calls, judged once: by the policy gateway on the agents' routes and by
``rft smoke``'s stand-in endpoint, so an agent a run would refuse is refused by smoke too.

A run hands its agents ``policy_server.api_key`` (the payload's ``rftkit.apiKey``, which the ``ctx``
clients send); with ``accept_sagemaker_tokens`` it also takes the bearer tokens AWS's SageMaker SDK
signs. Without either it takes every call.
"""

from __future__ import annotations

import hmac

from handlers.sagemaker_tokens import TOKEN_PREFIX, SageMakerTokenPolicy

KEY_REFUSAL = "Missing or wrong API key: send the header 'Authorization: Bearer <key>'."
# An agent on AWS's SageMaker SDK ignores the key and signs with the SDK's tokens: the refusal names
# the setting that accepts them.
SAGEMAKER_TOKEN_NOT_ACCEPTED = (
    "Missing or wrong API key: the bearer sent is a SageMaker token (AWS's SageMaker SDK signs calls "
    "with them), which this server does not accept: set policy_server.accept_sagemaker_tokens: true "
    "(`rft serve --accept-sagemaker-tokens`), or send the header 'Authorization: Bearer <key>'."
)

API_KEY = "the API key"
SAGEMAKER_TOKEN = "a SageMaker bearer token"
OTHER_BEARER = "another bearer (not the API key)"
NO_CREDENTIAL = "no credential"


def matches_key(authorization: str, key: str | None) -> bool:
    """Whether the Authorization header's value is ``Bearer <key>`` (compared in constant time)."""
    expected = f"Bearer {key}".encode("latin-1", "replace")
    return key is not None and hmac.compare_digest(authorization.encode("latin-1", "replace"), expected)


def is_sagemaker_bearer(authorization: str) -> bool:
    return authorization.startswith(f"Bearer {TOKEN_PREFIX}")


def agent_refusal(
    authorization: str, api_key: str | None, sagemaker_tokens: SageMakerTokenPolicy | None
) -> str | None:
    """None when a gateway with these settings takes ``authorization`` on the agents' routes, else the
    sentence of its 401."""
    if (api_key is None and sagemaker_tokens is None) or matches_key(authorization, api_key):
        return None
    if sagemaker_tokens is None:
        return SAGEMAKER_TOKEN_NOT_ACCEPTED if is_sagemaker_bearer(authorization) else KEY_REFUSAL
    token_refusal = sagemaker_tokens.refusal(authorization)
    if token_refusal is None:
        return None
    if api_key is None:
        return f"SageMaker token refused: {token_refusal}."
    return f"{KEY_REFUSAL[:-1]}, or a SageMaker token (refused: {token_refusal})."


def credential_sent(authorization: str, api_key: str | None) -> str:
    """What a call carried, in words: the API key, a SageMaker bearer token, another bearer, or none."""
    if matches_key(authorization, api_key):
        return API_KEY
    if is_sagemaker_bearer(authorization):
        return SAGEMAKER_TOKEN
    return OTHER_BEARER if authorization.strip() else NO_CREDENTIAL
