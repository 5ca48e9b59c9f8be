"""Which model-endpoint errors end an episode as an outcome of play, and which fail the rollout."""

from __future__ import annotations

import openai
from strands.types.exceptions import ContextWindowOverflowException, MaxTokensReachedException

_PLAY_OUTCOMES = (openai.BadRequestError, ContextWindowOverflowException, MaxTokensReachedException)


def ends_episode(error: BaseException) -> bool:
    """True for errors that end the episode as it stands (score it); False for infrastructure failures.

    A 400 from the policy endpoint (``Could not find job`` when no job is served, or a request the
    policy refuses), a context overflow and a truncated answer are outcomes of play. Anything else
    (403, 5xx, a dropped connection) is an infrastructure failure: let it propagate, so the rollout is
    reported failed rather than scored. Strands wraps errors, so the whole cause chain is searched.
    """
    seen: set[int] = set()
    current: BaseException | None = error
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if isinstance(current, _PLAY_OUTCOMES):
            return True
        current = current.__cause__ or current.__context__
    return False
