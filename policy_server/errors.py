"""The policy server's two failures: a request it refuses (4xx) and an engine that failed (5xx)."""

from __future__ import annotations


class Rejection(Exception):
    """A request the policy server refuses: an HTTP status (4xx) and a sentence for the caller."""

    def __init__(self, status_code: int, message: str) -> None:
        super().__init__(message)
        self.status_code = status_code
        self.message = message


class EngineError(Exception):
    """The engine failed on a call the gateway had accepted (answered with a 5xx)."""
