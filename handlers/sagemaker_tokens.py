"""The bearer tokens AWS's SageMaker SDK sends, checked offline.

An agent built on ``sagemaker-train`` signs every report it posts with ``Authorization: Bearer
sagemaker-api-key-<base64>``, where the base64 holds a SigV4-presigned URL:
``sagemaker.amazonaws.com/?Action=CallWithBearerToken&X-Amz-Algorithm=AWS4-HMAC-SHA256&X-Amz-Credential=
AKID/20261130/us-east-1/sagemaker/aws4_request&X-Amz-Date=...&X-Amz-Expires=...&X-Amz-SignedHeaders=host
&X-Amz-Signature=...&Version=1``. It ignores any other key.

What can be checked without AWS: the token is well formed, its URL is a presigned
``CallWithBearerToken`` call to ``sagemaker.amazonaws.com``, its credential scope names a date, a region
and the ``sagemaker`` service, it was signed at most ``X-Amz-Expires`` seconds ago (and not in the
future), and, when an allow-list is given, it names one of the allowed access key ids. What cannot: the
signature. Only AWS holds the secret key, so a token anyone forges with a listed access key id and a
made-up signature passes. These checks keep out clients that do not speak the protocol and stale or
foreign tokens; they are not authentication against an attacker who knows an allowed key id.
"""

from __future__ import annotations

import base64
import binascii
import re
from collections.abc import Collection
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from urllib.parse import parse_qs, urlsplit

TOKEN_PREFIX = "sagemaker-api-key-"
TOKEN_HOST = "sagemaker.amazonaws.com"
TOKEN_ACTION = "CallWithBearerToken"
SIGNING_SERVICE = "sagemaker"
MAX_EXPIRES_S = 43_200  # the SDK's longest token lifetime: 12 hours
DEFAULT_CLOCK_SKEW_S = 300.0

_AMZ_DATE = "%Y%m%dT%H%M%SZ"
_REGION = re.compile(r"^[a-z]{2}(-[a-z]+)+-\d+$")
_ACCESS_KEY_ID = re.compile(r"^[A-Z0-9]{16,128}$")
_SIGNATURE = re.compile(r"^[0-9a-f]{64}$")


class TokenRejected(ValueError):
    """The bearer token is not an acceptable SageMaker token; the message says why."""


@dataclass(frozen=True)
class SageMakerToken:
    """What a well-formed token claims (unverified: the signature cannot be checked offline)."""

    access_key_id: str
    region: str
    signed_at: datetime
    expires_at: datetime


def _single(query: dict[str, list[str]], name: str) -> str:
    values = query.get(name)
    if not values or len(values) != 1 or not values[0]:
        raise TokenRejected(f"the token's presigned URL lacks a single {name} parameter")
    return values[0]


def _decoded_url(token: str) -> str:
    if not token.startswith(TOKEN_PREFIX):
        raise TokenRejected(f"the bearer token does not start with {TOKEN_PREFIX!r}")
    encoded = token[len(TOKEN_PREFIX) :]
    try:
        return base64.b64decode(encoded, validate=True).decode("ascii")
    except (binascii.Error, UnicodeDecodeError):
        raise TokenRejected(f"the text after {TOKEN_PREFIX!r} is not base64 of a URL") from None


def _credential_scope(credential: str, signed_at: datetime) -> tuple[str, str]:
    """The access key id and region of ``AKID/YYYYMMDD/REGION/sagemaker/aws4_request``."""
    parts = credential.split("/")
    if len(parts) != 5 or parts[4] != "aws4_request":
        raise TokenRejected("X-Amz-Credential is not KEY/DATE/REGION/SERVICE/aws4_request")
    access_key_id, date, region, service, _ = parts
    if not _ACCESS_KEY_ID.match(access_key_id):
        raise TokenRejected("X-Amz-Credential does not start with an AWS access key id")
    if date != signed_at.strftime("%Y%m%d"):
        raise TokenRejected(f"the credential scope's date {date} is not the X-Amz-Date's")
    if not _REGION.match(region):
        raise TokenRejected(f"the credential scope's region {region!r} is not an AWS region")
    if service != SIGNING_SERVICE:
        raise TokenRejected(f"the token is signed for the {service!r} service, not {SIGNING_SERVICE!r}")
    return access_key_id, region


def parse_token(token: str) -> SageMakerToken:
    """The claims of a ``sagemaker-api-key-...`` token; :class:`TokenRejected` when malformed."""
    decoded = _decoded_url(token)
    # The SDK drops the scheme ("sagemaker.amazonaws.com/?Action=..."); a full URL is accepted too.
    url = urlsplit(decoded if "://" in decoded else f"https://{decoded}")
    if url.hostname != TOKEN_HOST or url.path not in ("", "/"):
        raise TokenRejected(f"the token's presigned URL is not for {TOKEN_HOST}/")
    query = parse_qs(url.query, keep_blank_values=True)
    if _single(query, "Action") != TOKEN_ACTION:
        raise TokenRejected(f"the token's presigned URL is not an Action={TOKEN_ACTION} call")
    if _single(query, "X-Amz-Algorithm") != "AWS4-HMAC-SHA256":
        raise TokenRejected("the token is not signed with AWS4-HMAC-SHA256")
    if "host" not in _single(query, "X-Amz-SignedHeaders").split(";"):
        raise TokenRejected("the token's signature does not cover the host header")
    if not _SIGNATURE.match(_single(query, "X-Amz-Signature")):
        raise TokenRejected("X-Amz-Signature is not 64 hex digits")
    try:
        signed_at = datetime.strptime(_single(query, "X-Amz-Date"), _AMZ_DATE).replace(tzinfo=UTC)
        expires_s = int(_single(query, "X-Amz-Expires"))
    except ValueError:
        raise TokenRejected("X-Amz-Date or X-Amz-Expires is not a date or a number of seconds") from None
    if not 0 < expires_s <= MAX_EXPIRES_S:
        raise TokenRejected(f"X-Amz-Expires {expires_s} is outside 1 to {MAX_EXPIRES_S} seconds")
    access_key_id, region = _credential_scope(_single(query, "X-Amz-Credential"), signed_at)
    return SageMakerToken(access_key_id, region, signed_at, signed_at + timedelta(seconds=expires_s))


def check_token(
    token: str,
    *,
    now: datetime,
    access_key_ids: Collection[str] = (),
    clock_skew_s: float = DEFAULT_CLOCK_SKEW_S,
) -> SageMakerToken:
    """``parse_token`` plus time and allow-list checks; :class:`TokenRejected` says what failed."""
    claims = parse_token(token)
    skew = timedelta(seconds=clock_skew_s)
    if claims.signed_at > now + skew:
        raise TokenRejected(f"the token is signed in the future ({claims.signed_at:%Y-%m-%dT%H:%M:%SZ})")
    if claims.expires_at + skew < now:
        raise TokenRejected(f"the token expired at {claims.expires_at:%Y-%m-%dT%H:%M:%SZ}: sign a new one")
    if access_key_ids and claims.access_key_id not in access_key_ids:
        raise TokenRejected(f"access key id {claims.access_key_id} is not in the allow-list")
    return claims


@dataclass(frozen=True)
class SageMakerTokenPolicy:
    """Whether the gateway accepts SDK tokens, and from which access key ids (empty: any)."""

    access_key_ids: frozenset[str] = frozenset()
    clock_skew_s: float = DEFAULT_CLOCK_SKEW_S

    def refusal(self, authorization: str) -> str | None:
        """None when ``authorization`` (the header's value) carries an acceptable token, else why not."""
        scheme, _, token = authorization.partition(" ")
        if scheme.lower() != "bearer" or not token.startswith(TOKEN_PREFIX):
            return "no SageMaker bearer token ('Authorization: Bearer sagemaker-api-key-...')"
        try:
            check_token(
                token.strip(),
                now=datetime.now(UTC),
                access_key_ids=self.access_key_ids,
                clock_skew_s=self.clock_skew_s,
            )
        except TokenRejected as error:
            return str(error)
        return None
