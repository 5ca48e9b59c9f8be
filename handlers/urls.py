"""``http_url``: the one check of an http(s) URL a user or an agent hands rftkit (an agent's policy
endpoint, vLLM's address, the gateway's public URL)."""

from __future__ import annotations

from urllib.parse import urlsplit


def http_url(value: str, name: str | None = None) -> str:
    """``value`` without surrounding spaces or a trailing slash; a ValueError (naming ``name``, when
    given) if it is not an http:// or https:// URL with a host and a port in range."""
    name = f"{name} " if name else ""
    value = value.strip().rstrip("/")
    if not value.startswith(("http://", "https://")):
        raise ValueError(f"{name}must be an http:// or https:// URL")
    if any(char.isspace() or not char.isprintable() for char in value):
        raise ValueError(f"{name}must not contain spaces or control characters")
    try:
        parts = urlsplit(value)
        parts.port  # noqa: B018 - raises ValueError when the port is out of range
    except ValueError as error:
        raise ValueError(f"{name}is not a usable URL: {error}") from None
    if not parts.hostname:
        raise ValueError(f"{name}must name a host")
    return value
