"""Playing rollouts: requests to the agents (``fanout``), what they came back as (``outcomes``), the
event loop they play on (``producer``), which step's rollouts start when (``pipeline``), evaluations
(``evaluation``) and the rows they are played on (``dataset``).

The public surface, loaded lazily.
"""

from __future__ import annotations

from handlers import lazy_attributes

_LAZY = {
    "PlayedRollout": "trainer.rollouts.producer",
    "RolloutRequest": "trainer.rollouts.fanout",
    "Fanout": "trainer.rollouts.fanout",
    "RolloutOutcome": "trainer.rollouts.outcomes",
    "FailureCounts": "trainer.rollouts.outcomes",
}

__all__ = sorted(_LAZY)

__getattr__ = lazy_attributes(__name__, _LAZY)
