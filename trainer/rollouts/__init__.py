"""Playing rollouts: requests to the agents (``fanout``), what they came back as (``outcomes``), the
event loop they play on (``producer``), which step's rollouts start when (``pipeline``), evaluations
(``evaluation``) and the rows they are played on (``dataset``).

The public surface, loaded lazily.
"""

from __future__ import annotations

from typing import Any

_LAZY = {
    "PlayedRollout": "trainer.rollouts.producer",
    "RolloutRequest": "trainer.rollouts.fanout",
    "Fanout": "trainer.rollouts.fanout",
    "RolloutOutcome": "trainer.rollouts.outcomes",
    "FailureCounts": "trainer.rollouts.outcomes",
}

__all__ = sorted(_LAZY)


def __getattr__(name: str) -> Any:
    if name not in _LAZY:
        raise AttributeError(f"module 'trainer.rollouts' has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(_LAZY[name]), name)
