"""The credential on an agent's calls, judged once: by the policy gateway on the agents' routes and by
``rft smoke``'s stand-in endpoint, so an agent a run would refuse is refused by smoke too.

A run hands its agents ``policy_server.api_key`` (the payload's ``rftkit.apiKey``, which the ``ctx``
clients send); with ``accept_sagemaker_tokens`` it also takes the bearer tokens AWS's SageMaker SDK
signs. Without either it takes every call, which a gateway reachable from other machines refuses to
do unless told so (:func:`exposure_refusal`).
"""

from __future__ import annotations

import hmac
import ipaddress

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


# The settings that guard a gateway, named where it refuses to serve unguarded.
UNGUARDED_REMEDY = (
    "Give the agents a key (policy_server.api_key: leave it unset for a fresh key per run, or set your "
    "own; rft serve --api-key), bind 127.0.0.1, or, on a network you trust, set "
    "policy_server.allow_unauthenticated_network: true (rft serve --allow-unauthenticated-network)."
)


def is_loopback(host: str) -> bool:
    try:
        return host == "localhost" or ipaddress.ip_address(host).is_loopback
    except ValueError:  # a host name other than localhost may resolve to anything
        return False


def exposure_refusal(host: str, api_key: str | None, sagemaker_tokens: bool) -> str | None:
    """Why a gateway on ``host`` with these credentials must not start unless told so, or None: it is
    reachable from other machines and checks no credential."""
    if api_key or sagemaker_tokens or is_loopback(host):
        return None
    return (
        f"refusing to serve on {host} without any credential check: it is reachable from other "
        "machines, and anyone who can reach it could use the model, spend its compute and send calls "
        f"and rewards into open rollouts. {UNGUARDED_REMEDY}"
    )
