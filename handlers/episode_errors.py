"""Which model-endpoint errors end an episode as an outcome of play, and which fail the rollout."""

from __future__ import annotations

from collections.abc import Iterator

import openai
from strands.types.exceptions import ContextWindowOverflowException, MaxTokensReachedException

_PLAY_OUTCOMES = (openai.BadRequestError, ContextWindowOverflowException, MaxTokensReachedException)


def _cause_chain(error: BaseException) -> Iterator[BaseException]:
    """``error`` and what it wraps (Strands wraps errors), each once."""
    seen: set[int] = set()
    current: BaseException | None = error
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        yield current
        current = current.__cause__ or current.__context__


def ends_episode(error: BaseException) -> bool:
    """True for errors that end the episode as it stands (score it); False for infrastructure failures.

    A 400 from the policy endpoint (``Could not find job`` when no job is served, or a request the
    policy refuses), a context overflow and a truncated answer are outcomes of play. Anything else
    (403, 5xx, a dropped connection) is an infrastructure failure: let it propagate, so the rollout is
    reported failed rather than scored. Strands wraps errors, so the whole cause chain is searched.
    """
    return any(isinstance(current, _PLAY_OUTCOMES) for current in _cause_chain(error))


def refused_by_endpoint(error: BaseException) -> bool:
    """True when the policy endpoint refused the call (a 400, e.g. ``Could not find job``): no play
    happened, as opposed to an answer cut off by max tokens or a full context."""
    return any(isinstance(current, openai.BadRequestError) for current in _cause_chain(error))
